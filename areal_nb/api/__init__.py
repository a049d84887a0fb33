"""Shared vocabulary of areal_nb. Imports nothing else from the package."""

from .engine_api import InferenceEngine
from .io_struct import STOP_REASONS, GenerationConfig, ModelRequest, ModelResponse
from .vocabulary import (
    CHAT_TEMPLATE_TYPES,
    CREDIT_MODES,
    CREDIT_NORMS,
    DISCOUNT_MODES,
    EXPORT_STYLES,
    ChatTemplateType,
    CreditMode,
    CreditNorm,
    DiscountMode,
    ExportStyle,
)
from .workflow_api import RolloutWorkflow

__all__ = [
    "CHAT_TEMPLATE_TYPES",
    "CREDIT_MODES",
    "CREDIT_NORMS",
    "DISCOUNT_MODES",
    "EXPORT_STYLES",
    "ChatTemplateType",
    "CreditMode",
    "CreditNorm",
    "DiscountMode",
    "ExportStyle",
    "STOP_REASONS",
    "GenerationConfig",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "RolloutWorkflow",
]

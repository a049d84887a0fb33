"""Shared vocabulary of areal_nb. Imports nothing else from the package."""

from .by_value import NotSerializableError
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
    can_export_concat,
    check_export_style,
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
    "NotSerializableError",
    "RolloutWorkflow",
    "can_export_concat",
    "check_export_style",
]

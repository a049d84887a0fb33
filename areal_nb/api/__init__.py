"""Shared vocabulary of areal_nb. Imports nothing else from the package."""

from .engine_api import InferenceEngine
from .io_struct import (
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    STOP_REASONS,
    GenerationConfig,
    InvalidRequestError,
    ModelRequest,
    ModelResponse,
)
from .vocabulary import (
    CHAT_TEMPLATE_TYPES,
    DISCOUNT_MODES,
    EXPORT_STYLES,
    ChatTemplateType,
    DiscountMode,
    ExportStyle,
)
from .workflow_api import RolloutWorkflow

__all__ = [
    "CHAT_TEMPLATE_TYPES",
    "DISCOUNT_MODES",
    "EXPORT_STYLES",
    "ChatTemplateType",
    "DiscountMode",
    "ExportStyle",
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "STOP_REASONS",
    "InvalidRequestError",
    "GenerationConfig",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "RolloutWorkflow",
]

"""Shared vocabulary of areal_nb. Imports nothing else from the package."""

from .agent_rewards import AgentRewards
from .agent_weights import AgentWeights, agent_token
from .by_value import NotSerializableError
from .constraints import CONSTRAINT_KINDS, OutputConstraint, SamplingMasks, SamplingSpan
from .engine_api import InferenceEngine
from .import_path import import_object
from .in_place_adapters import InPlaceAdapters, LowRankAdapter
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
from .lora_adapter import LoraAdapter
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
    "AgentRewards",
    "AgentWeights",
    "agent_token",
    "CONSTRAINT_KINDS",
    "OutputConstraint",
    "SamplingMasks",
    "SamplingSpan",
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
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "STOP_REASONS",
    "InvalidRequestError",
    "GenerationConfig",
    "InferenceEngine",
    "InPlaceAdapters",
    "LoraAdapter",
    "LowRankAdapter",
    "ModelRequest",
    "ModelResponse",
    "NotSerializableError",
    "RolloutWorkflow",
    "can_export_concat",
    "check_export_style",
    "import_object",
]

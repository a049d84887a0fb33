"""Shared vocabulary of areal_nb. Imports nothing else from the package."""

from .engine_api import InferenceEngine
from .io_struct import STOP_REASONS, GenerationConfig, ModelRequest, ModelResponse
from .workflow_api import RolloutWorkflow

__all__ = [
    "STOP_REASONS",
    "GenerationConfig",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "RolloutWorkflow",
]

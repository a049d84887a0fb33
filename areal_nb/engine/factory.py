"""`create_engine`: the one place an engine is made from its config section.

The Session (and any script) asks for an engine here by `type`; new engine types are added
here, not in the Session. Today: "local", the embedded transformers engine.
"""

from __future__ import annotations

from typing import Any, Protocol

from areal_nb.api import InferenceEngine

ENGINE_TYPES = ("local",)


class EngineSpec(Protocol):
    """What the factory reads of a config section (`areal_nb.config.EngineConfig` is one)."""

    type: str
    max_batch_size: int
    seed: int


def create_engine(
    spec: EngineSpec,
    model: Any,
    tokenizer: Any,
    *,
    model_path: str | None = None,
    device: Any = None,
    dtype: Any = None,
) -> InferenceEngine:
    """An engine serving `model` (a loaded model, or a path for engines that load their own).

    `model_path` names the weights for engines that run out of process; `device` and `dtype`
    say where the embedded engine keeps its copy.
    """
    if spec.type == "local":
        import torch

        from .local import LocalEngine

        return LocalEngine(model if model is not None else model_path, tokenizer, device=device,
                           dtype=dtype or torch.float32, max_batch_size=spec.max_batch_size, seed=spec.seed)
    raise ValueError(f"engine.type={spec.type!r} is not available in this build; choose one of {list(ENGINE_TYPES)}")

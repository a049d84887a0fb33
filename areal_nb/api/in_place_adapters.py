"""`InPlaceAdapters`: a LoRA policy's adapter tensors themselves, for an engine that serves the
trainer's parameters in place.

An embedded engine that shares the trainer's tensors (`InferenceEngine.shares_weights`) serves a
LoRA policy without a merged copy: its forward adds `scaling · B(A(x))` to the output of each
adapted linear module, reading the frozen base and these adapter tensors where the trainer keeps
them. The trainer pushes an `InPlaceAdapters` with `update_weights`: the first push attaches the
tensors, and every push is then a version change (the engine rebuilds only what it derives from
the adapters), made while the engine is paused, as for full fine-tuning in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LowRankAdapter:
    """One adapted linear module's adapter: its output gains `scaling · x Aᵀ Bᵀ`."""

    a: Any  # [r, in_features]: the trainer's lora_A weight itself (no copy)
    b: Any  # [out_features, r]: the trainer's lora_B weight itself
    scaling: float  # alpha / r


@dataclass(frozen=True)
class InPlaceAdapters:
    # the adapted linear module's name in the plain model ("model.layers.0.self_attn.q_proj") →
    # its adapter
    modules: dict[str, LowRankAdapter]

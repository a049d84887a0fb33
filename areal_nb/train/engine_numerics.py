"""When the engine's recorded log-probs already are π_prox, so the trainer need not recompute them.

π_prox (the decoupled loss's proximal policy, π_old of the plain PPO ratio with
`recompute_logprob`) is the current weights' log-prob of every generated token, computed by a
separate no-grad forward before the update. The embedded engine records exactly that when it
samples with the very weights the trainer holds, in the very dtype the trainer computes in, on
the same kind of device, at the temperature the trainer divides by: its record differs from the
recomputation by float rounding only (another summation order), so the forward buys nothing.

It holds for a batch when every one of these holds:
- the engine says how it computes (`EngineNumerics`: the Session passes it for its embedded
  engine; servers and LoRA policies, whose merged weights round differently, give none);
- no mixed precision: engine dtype == compute dtype == the model's own dtype (autocast computes
  in another order than a model cast to that dtype);
- the same device type (CPU and CUDA kernels round differently);
- the engine's temperature is the trainer's (`Actor(temperature=)`; an agent that asks for
  another temperature in its calls breaks this: keep it at `rollout.temperature`);
- every generated token was sampled at the trainer's current version (a token of an older
  version, or one whose call started before a weight update, has another policy's log-prob);
- no replayed sampling mask (`replay_sampling_masks` renormalises over recorded allowed sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class EngineNumerics:
    """How an engine computes the log-probs it records."""

    dtype: torch.dtype  # of its weights and arithmetic
    device: str  # "cpu", "cuda", "cuda:1", ...: only the type is compared
    temperature: float  # the sampling temperature its log-probs are taken at


def engine_logprobs_are_current(
    engine: EngineNumerics | None,
    *,
    compute_dtype: torch.dtype,
    model_dtype: torch.dtype,
    device: torch.device,
    temperature: float,
    versions: Tensor | None,
    mask: Tensor,
    version: int,
) -> bool:
    """Whether the engine's log-probs on `mask` are the trainer's π_prox at `version` (see the
    module docstring): `versions` [B, L] is each token's sampling version, `mask` the generated
    tokens the loss reads."""
    if engine is None or versions is None or not bool(mask.any()):
        return False
    if not engine.dtype == compute_dtype == model_dtype:
        return False
    if torch.device(engine.device).type != device.type or engine.temperature != temperature:
        return False
    return bool((versions[mask] == version).all())

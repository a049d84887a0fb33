"""Train-inference mismatch: the engine's recorded log-probs against the trainer's recomputation.

The engine samples with its own kernels (and, on a GPU, often another precision), so the
probability it recorded for a token, π_infer, differs from the trainer's π_train for the same
weights. The policy gradient assumes the tokens came from π_train; the importance weight

    w_t = π_train(y_t) / π_infer(y_t) = exp(log π_train − log π_infer)          (level "token")
    w_i = Π_t w_t = exp(Σ_t (log π_train − log π_infer)) on every token of row i   (level "sequence")

corrects for it, bounded by a threshold C (`actor.mismatch_threshold`):

    TIS (truncated importance sampling):  weight = min(w, C)
    MIS (masked importance sampling):     weight = w if w ≤ C else 0 (the token / row is dropped)

The loss multiplies each token's term by its weight (`policy_loss.py`). Metrics, every step
(with any recomputation, corrected or not): mean |Δ log p|, the k3 estimate of KL(π_infer ‖ π_train)
(ρ − 1 − log ρ with ρ = w_t, unbiased for samples of π_infer), and the fraction of loss tokens
truncated or masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from areal_nb.errors import InvalidArgumentError


@dataclass
class MismatchTerms:
    weight: Tensor  # [B, L] float32: the factor on each token's loss term (1 off the mask)
    truncated: Tensor  # bool [B, L]: TIS bounded the weight at C
    masked: Tensor  # bool [B, L]: MIS dropped the token (weight 0)


def mismatch_weights(
    trainer_logprobs: Tensor,
    engine_logprobs: Tensor,
    loss_mask: Tensor,
    correction: str,
    level: str = "token",
    threshold: float = 2.0,
) -> MismatchTerms:
    """The TIS / MIS weight of every loss token (see the module docstring); no gradient."""
    if correction not in ("tis", "mis"):
        raise InvalidArgumentError(f"mismatch correction must be 'tis' or 'mis', got {correction!r}")
    if level not in ("token", "sequence"):
        raise InvalidArgumentError(f"mismatch level must be 'token' or 'sequence', got {level!r}")
    if threshold <= 1:
        raise InvalidArgumentError(f"mismatch threshold must be > 1, got {threshold}")
    mask = loss_mask.bool()
    log_w = torch.where(mask, trainer_logprobs.detach().float() - engine_logprobs.detach().float(), 0.0)
    if level == "sequence":
        log_w = torch.where(mask, log_w.sum(1, keepdim=True).expand_as(log_w), 0.0)
    above = (log_w > math.log(threshold)) & mask
    if correction == "tis":
        # exp of the clamped log: a far-off sequence's product never overflows
        weight = log_w.clamp(max=math.log(threshold)).exp()
        return MismatchTerms(torch.where(mask, weight, 1.0), above, torch.zeros_like(mask))
    weight = torch.where(above, 0.0, log_w.clamp(max=math.log(threshold)).exp())
    return MismatchTerms(torch.where(mask, weight, 1.0), torch.zeros_like(mask), above)


def mismatch_stats(
    trainer_logprobs: Tensor, engine_logprobs: Tensor, loss_mask: Tensor, terms: MismatchTerms | None = None
) -> dict[str, float]:
    """`mismatch_logp_abs_diff` (mean |Δ log p|), `mismatch_kl_k3`, and with `terms`
    `mismatch_weight_mean`, `mismatch_truncated_frac`, `mismatch_masked_frac` over loss tokens."""
    mask = loss_mask.bool()
    n = int(mask.sum())
    if n == 0:
        return {}
    delta = (trainer_logprobs.detach().float() - engine_logprobs.detach().float())[mask]
    out = {
        "mismatch_logp_abs_diff": float(delta.abs().mean()),
        "mismatch_kl_k3": float((torch.expm1(delta) - delta).mean()),
    }
    if terms is not None:
        out.update(
            mismatch_weight_mean=float(terms.weight[mask].mean()),
            mismatch_truncated_frac=float(terms.truncated[mask].sum()) / n,
            mismatch_masked_frac=float(terms.masked[mask].sum()) / n,
        )
    return out


def mismatch_report(
    cfg: Any, trainer_logprobs: Tensor, engine_logprobs: Tensor, loss_mask: Tensor
) -> dict[str, float]:
    """A train step's mismatch metrics under `cfg` (a `GRPOConfig`): with its correction, also
    the weights' mean and the fraction truncated / masked (0 without a correction)."""
    terms = None
    if cfg.mismatch_correction is not None:
        terms = mismatch_weights(
            trainer_logprobs,
            engine_logprobs,
            loss_mask,
            cfg.mismatch_correction,
            cfg.mismatch_level,
            cfg.mismatch_threshold,
        )
    stats = mismatch_stats(trainer_logprobs, engine_logprobs, loss_mask, terms)
    if terms is None and stats:
        stats.update(mismatch_truncated_frac=0.0, mismatch_masked_frac=0.0)
    return stats

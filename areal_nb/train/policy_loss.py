"""The policy-loss variants: importance ratio, objective, aggregation (names as the papers and TRL use them).

Per loss token t of row i, with advantage A, anchor policy π_a (π_prox with the decoupled loss,
else π_old), r_t = π_θ(y_t) / π_a(y_t), ε_low = `eps_clip`, ε_high = `eps_clip_higher` (None: ε_low):

importance ratio (`importance_level`)
- "token" (PPO):     ρ_t = r_t
- "sequence" (GSPO): s_i = exp((1/|y_i|) Σ_t log r_t), the length-normalised geometric mean, used
  in GSPO-token form ρ_t = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]: its value is s_i at every token of
  the row and, averaged over the row's tokens, its gradient is ∇s_i (clipping is per sequence).

objective (`policy_loss`)
- "ppo":   ℓ_t = max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high)); dual clip for A < 0:
           min(ℓ_t, −c_clip·A)
- "cispo": ℓ_t = −sg[clip(ρ_t, 1 − ε_low, 1 + ε_high)] · A · log π_θ(y_t)   (MiniMax-M1: REINFORCE
           with a clipped, stop-gradient importance weight: every token keeps a gradient)

then, as in `loss.py`, the decoupled loss's behaviour weight w_t = π_prox/π_behave (tokens above
`behave_imp_weight_cap` masked), and the train-inference mismatch weight (`mismatch.py`).

aggregation (`loss_agg`, `loss_normalizer`): loss = Σ_t ℓ_t / norm_t over a minibatch of R rows
(rows with at least one loss token), N loss tokens, row i with n_i of them
- "token_mean" (DAPO; this trainer's GRPO):       norm_t = N
- "seq_mean_token_mean" (the GRPO paper; GSPO):   norm_t = R · n_i     (mean over rows of row means)
- "seq_sum_norm" (Dr. GRPO):                      norm_t = R · C       (row sums over a constant C:
  `loss_agg_constant`, or the longest row's n_i in the batch)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from .mismatch import MismatchTerms, mismatch_weights


@dataclass
class LossTerms:
    """One `policy_loss_terms` call: the loss, its stats and the per-token values it is made of.

    Every tensor has the input's shape and is detached except `loss`. Outside `loss_mask` the
    values are neutral (ratio 1, weight 1, flags False, contribution 0).
    """

    loss: Tensor  # scalar with gradient: Σ contribution
    stats: dict[str, float]
    advantages: Tensor
    ratio: Tensor  # r = π_θ / π_prox (decoupled) or π_θ / π_old
    clipped: Tensor  # bool: the clipped branch of the PPO max was taken
    dual_clipped: Tensor  # bool: dual clip bounded the loss (A < 0)
    behave_weight: Tensor  # w = π_prox / π_behave (1 without the decoupled loss)
    behave_capped: Tensor  # bool: w > behave_imp_weight_cap, the token is masked out
    entropy: Tensor | None
    contribution: Tensor  # the token's share of `loss` (0 for masked-out tokens)


def loss_normalizer(
    mask: Tensor, rows: Tensor, agg: str = "token_mean", constant: int | None = None
) -> int | Tensor:
    """The divisor of every token of minibatch `rows` (`mask`: the whole batch's loss mask [B, L]).

    "token_mean": the minibatch's token count (an int, as the trainer always used); the other
    aggregations: a [B, L] tensor (rows outside the minibatch hold its value too; only the
    minibatch's tokens read it). Data-parallel ranks see the whole batch, so every rank divides alike.
    """
    mask = mask.bool()
    if agg == "token_mean":
        return max(int(mask[rows].sum()), 1)
    counts = mask.sum(1)
    n_seq = max(int((counts[rows] > 0).sum()), 1)
    if agg == "seq_mean_token_mean":
        per_row = counts.clamp(min=1).float() * n_seq
    elif agg == "seq_sum_norm":
        c = constant if constant is not None else max(int(counts.max()), 1)
        per_row = torch.full(counts.shape, float(c * n_seq), device=mask.device)
    else:
        raise InvalidArgumentError(
            f"loss_agg must be 'token_mean', 'seq_mean_token_mean' or 'seq_sum_norm', got {agg!r}"
        )
    return per_row.unsqueeze(1).expand(mask.shape)


# The loss term by term as the module docstring writes it (checks, ratio, objective, behaviour
# weight, mismatch, stats): one function, so that it reads against the formula in one pass.
def policy_loss_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    importance_level: str = "token",
    policy_loss: str = "ppo",
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    prox_logprobs: Tensor | None = None,
    behave_imp_weight_cap: float | None = None,
    entropy: Tensor | None = None,
    normalizer: float | Tensor | None = None,
    mismatch: MismatchTerms | None = None,
) -> LossTerms:
    """The loss of the module docstring and its per-token values (`LossTerms`).

    Token ratio, PPO, no mismatch weight is `loss.ppo_loss_terms` (GRPO's loss). `normalizer` may
    be a tensor shaped like the tokens (`loss_normalizer`). Stats: `n_tokens`, `clip_frac`,
    `dual_clip_frac`, `approx_kl` (the per-token k3 of π_a → π_θ whatever the ratio level),
    `approx_kl_k1`, `importance_weight_mean/min/max`, with `prox_logprobs` the behaviour weight's
    and `behave_masked_frac`, `entropy` if given.
    """
    if importance_level not in ("token", "sequence"):
        raise InvalidArgumentError(
            f"importance_level must be 'token' or 'sequence', got {importance_level!r}"
        )
    if policy_loss not in ("ppo", "cispo"):
        raise InvalidArgumentError(f"policy_loss must be 'ppo' or 'cispo', got {policy_loss!r}")
    shapes = {t.shape for t in (logprobs, old_logprobs, advantages, loss_mask)}
    if prox_logprobs is not None:
        shapes.add(prox_logprobs.shape)
    if len(shapes) != 1:
        raise InvalidArgumentError(
            f"logprobs, old/prox logprobs, advantages and loss_mask must share a shape, got {shapes}"
        )
    if c_clip is not None and c_clip <= 1:
        raise InvalidArgumentError(f"c_clip must be > 1 (dual clip), got {c_clip}")
    if c_clip is not None and policy_loss == "cispo":
        raise InvalidArgumentError(
            f"c_clip (dual clip) applies to the PPO objective only, got {c_clip} with cispo"
        )
    if behave_imp_weight_cap is not None and behave_imp_weight_cap <= 1:
        raise InvalidArgumentError(f"behave_imp_weight_cap must be > 1, got {behave_imp_weight_cap}")
    mask = loss_mask.bool()
    n_tokens = int(mask.sum())
    if normalizer is None:
        normalizer = max(n_tokens, 1)
    advantages = advantages.detach().float()
    old_logprobs = old_logprobs.detach().float()
    anchor = old_logprobs if prox_logprobs is None else prox_logprobs.detach().float()
    current = logprobs.float()

    token_log_ratio = torch.where(mask, current - anchor, 0.0)
    if importance_level == "sequence":
        per_row = mask.sum(1, keepdim=True).clamp(min=1)
        sequence_log_ratio = token_log_ratio.sum(1, keepdim=True) / per_row
        log_ratio = torch.where(mask, sequence_log_ratio.detach() + (current - current.detach()), 0.0)
    else:
        log_ratio = token_log_ratio
    ratio = log_ratio.exp()
    bounds = (1 - eps_clip, 1 + (eps_clip if eps_clip_higher is None else eps_clip_higher))
    dual_clipped = torch.zeros_like(mask)
    if policy_loss == "ppo":
        loss_unclipped = -advantages * ratio
        loss_clipped = -advantages * ratio.clamp(*bounds)
        pg_loss = torch.maximum(loss_unclipped, loss_clipped)
        clipped = (loss_clipped > loss_unclipped) & mask
        if c_clip is not None:
            dual_bound = -c_clip * advantages
            dual_clipped = (advantages < 0) & (pg_loss > dual_bound) & mask
            pg_loss = torch.where(dual_clipped, dual_bound, pg_loss)
    else:
        weight = ratio.detach().clamp(*bounds)
        clipped = (weight != ratio.detach()) & mask
        pg_loss = -weight * advantages * torch.where(mask, current, 0.0)

    token_mask = mask
    stats: dict[str, float] = {}
    behave_weight = torch.ones_like(ratio)
    if prox_logprobs is not None:
        behave_weight = torch.where(mask, anchor - old_logprobs, 0.0).exp()
        if behave_imp_weight_cap is not None:
            token_mask = mask & (behave_weight <= behave_imp_weight_cap)
        pg_loss = pg_loss * behave_weight
        stats.update(_min_mean_max("behave_imp_weight", behave_weight, mask))
        stats["behave_masked_frac"] = _frac(mask & ~token_mask, n_tokens)
    behave_capped = mask & ~token_mask
    if mismatch is not None:
        pg_loss = pg_loss * mismatch.weight
        token_mask = token_mask & ~mismatch.masked

    contribution = torch.where(token_mask, pg_loss, 0.0) / normalizer
    loss = contribution.sum()
    with torch.no_grad():
        stats["n_tokens"] = float(n_tokens)
        stats["clip_frac"] = _frac(clipped, n_tokens)
        stats["dual_clip_frac"] = _frac(dual_clipped, n_tokens)
        stats["approx_kl"] = _masked_mean(torch.expm1(token_log_ratio) - token_log_ratio, mask, n_tokens)
        stats["approx_kl_k1"] = _masked_mean(-token_log_ratio, mask, n_tokens)
        stats.update(_min_mean_max("importance_weight", ratio, mask))
        if entropy is not None:
            stats["entropy"] = _masked_mean(entropy.detach().float(), mask, n_tokens)
    return LossTerms(
        loss=loss,
        stats=stats,
        advantages=torch.where(mask, advantages, 0.0),
        ratio=ratio.detach(),
        clipped=clipped,
        dual_clipped=dual_clipped,
        behave_weight=behave_weight.detach(),
        behave_capped=behave_capped,
        entropy=None if entropy is None else torch.where(mask, entropy.detach().float(), 0.0),
        contribution=contribution.detach(),
    )


def variant_loss_terms(
    cfg: Any,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    prox_logprobs: Tensor | None,
    engine_logprobs: Tensor,
    entropy: Tensor | None,
    normalizer: float | Tensor,
) -> tuple[LossTerms, MismatchTerms | None]:
    """One micro-batch's loss under `cfg` (a `GRPOConfig`): what `Actor.train_step` and the lab call.

    The mismatch weight compares the trainer's recomputation (`prox_logprobs`) with the engine's
    record; it is applied with `cfg.mismatch_correction` and returned for the views and stats.
    """
    mismatch = None
    if cfg.mismatch_correction is not None:
        if prox_logprobs is None:
            raise InvalidArgumentError(
                "mismatch_correction needs the trainer's recomputed log-probs (recompute_logprob=true)"
            )
        mismatch = mismatch_weights(
            prox_logprobs,
            engine_logprobs,
            loss_mask,
            cfg.mismatch_correction,
            cfg.mismatch_level,
            cfg.mismatch_threshold,
        )
    terms = policy_loss_terms(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        importance_level=cfg.importance_level,
        policy_loss=cfg.policy_loss,
        eps_clip=cfg.eps_clip,
        eps_clip_higher=cfg.eps_clip_higher,
        c_clip=cfg.c_clip,
        prox_logprobs=prox_logprobs if cfg.use_decoupled_loss else None,
        behave_imp_weight_cap=cfg.behave_imp_weight_cap if cfg.use_decoupled_loss else None,
        entropy=entropy,
        normalizer=normalizer,
        mismatch=mismatch,
    )
    return terms, mismatch


def _frac(selected: Tensor, n_tokens: int) -> float:
    return float(selected.sum()) / n_tokens if n_tokens else 0.0


def _masked_mean(values: Tensor, mask: Tensor, n_tokens: int) -> float:
    return float(torch.where(mask, values, 0.0).sum()) / n_tokens if n_tokens else 0.0


def _min_mean_max(name: str, values: Tensor, mask: Tensor) -> dict[str, float]:
    values = values.detach()
    if not mask.any():
        return {f"{name}_mean": 0.0, f"{name}_min": 0.0, f"{name}_max": 0.0}
    selected = values[mask]
    return {
        f"{name}_mean": float(selected.mean()),
        f"{name}_min": float(selected.min()),
        f"{name}_max": float(selected.max()),
    }

"""The PPO clipped actor objective used by GRPO, with the optional decoupled (off-policy) form.

Three policies meet here (names as in AReaL's decoupled PPO):
- π_θ      `logprobs`: the weights being trained (has gradients);
- π_prox   `prox_logprobs`: the same weights before this train step (recomputed, no gradient);
- π_behave `old_logprobs`: the engine weights that sampled the tokens (recorded at rollout).

Plain PPO clips r = π_θ / π_old. Decoupled PPO clips r = π_θ / π_prox and multiplies each token
by the behaviour weight w = π_prox / π_behave. Unlike AReaL (which applies it only with rejection
sampling configured) the weight is always
applied when `prox_logprobs` is given. Tokens with w > `behave_imp_weight_cap` are masked out
(AReaL's rejection-sampling "mask" action): their weight is unreliable and clamping it would
still push on a token the behaviour policy considered unlikely.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossTerms:
    """One `ppo_loss_terms` call: the loss, its stats and the per-token values it is made of.

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


def ppo_actor_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    prox_logprobs: Tensor | None = None,
    behave_imp_weight_cap: float | None = None,
    entropy: Tensor | None = None,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Σ over loss-masked tokens of the clipped policy-gradient loss, divided by `normalizer`.

    `normalizer` defaults to this call's number of loss-masked tokens (token-level mean). To
    split a minibatch into micro-batches and still get its exact token-level mean, pass the
    minibatch's token count to every micro-batch and sum the losses (or their gradients).
    Tokens masked by the behaviour-weight cap still count in the normaliser.

    Per token, with ratio r and advantage A:
      loss = max(−A·r, −A·clip(r, 1 − eps_clip, 1 + eps_clip_higher))
      and for A < 0 with dual clip: min(loss, −c_clip·A).

    Stats (plain floats over this call's loss-masked tokens): `n_tokens`, `clip_frac`,
    `dual_clip_frac`, `approx_kl` (k3 = (r − 1) − log r, an unbiased, non-negative estimate of
    KL(π_ref‖π_θ) where π_ref is π_prox or π_old), `approx_kl_k1` (mean −log r),
    `importance_weight_mean/min/max` (r), and with `prox_logprobs`
    `behave_imp_weight_mean/min/max` (w, before capping) and `behave_masked_frac`; `entropy`
    if given. `ppo_loss_terms` takes the same arguments and also returns the per-token values.
    """
    terms = ppo_loss_terms(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        eps_clip,
        eps_clip_higher,
        c_clip,
        prox_logprobs,
        behave_imp_weight_cap,
        entropy,
        normalizer,
    )
    return terms.loss, terms.stats


def ppo_loss_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    prox_logprobs: Tensor | None = None,
    behave_imp_weight_cap: float | None = None,
    entropy: Tensor | None = None,
    normalizer: float | Tensor | None = None,
) -> LossTerms:
    """`ppo_actor_loss` with the per-token values kept (for loss inspection)."""
    if c_clip is not None and c_clip <= 1:
        raise ValueError(f"c_clip must be > 1 (dual clip), got {c_clip}")
    if behave_imp_weight_cap is not None and behave_imp_weight_cap <= 1:
        raise ValueError(f"behave_imp_weight_cap must be > 1, got {behave_imp_weight_cap}")
    shapes = {t.shape for t in (logprobs, old_logprobs, advantages, loss_mask)}
    if prox_logprobs is not None:
        shapes.add(prox_logprobs.shape)
    if len(shapes) != 1:
        raise ValueError(
            f"logprobs, old/prox logprobs, advantages and loss_mask must share a shape, got {shapes}"
        )

    mask = loss_mask.bool()
    n_tokens = int(mask.sum())
    if normalizer is None:
        normalizer = max(n_tokens, 1)
    advantages = advantages.detach().float()
    old_logprobs = old_logprobs.detach().float()
    anchor = old_logprobs if prox_logprobs is None else prox_logprobs.detach().float()

    # Outside the mask the log-ratio is set to 0 so padding can never produce inf·0 = nan.
    log_ratio = torch.where(mask, logprobs.float() - anchor, 0.0)
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - eps_clip, 1 + (eps_clip if eps_clip_higher is None else eps_clip_higher))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * clipped_ratio
    pg_loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = (loss_clipped > loss_unclipped) & mask
    dual_clipped = torch.zeros_like(mask)
    if c_clip is not None:
        dual_bound = -c_clip * advantages
        dual_clipped = (advantages < 0) & (pg_loss > dual_bound) & mask
        pg_loss = torch.where(dual_clipped, dual_bound, pg_loss)

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

    contribution = torch.where(token_mask, pg_loss, 0.0) / normalizer
    loss = contribution.sum()

    with torch.no_grad():
        stats["n_tokens"] = float(n_tokens)
        stats["clip_frac"] = _frac(clipped, n_tokens)
        stats["dual_clip_frac"] = _frac(dual_clipped, n_tokens)
        stats["approx_kl"] = _masked_mean(torch.expm1(log_ratio) - log_ratio, mask, n_tokens)
        stats["approx_kl_k1"] = _masked_mean(-log_ratio, mask, n_tokens)
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
        behave_capped=mask & ~token_mask,
        entropy=None if entropy is None else torch.where(mask, entropy.detach().float(), 0.0),
        contribution=contribution.detach(),
    )


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

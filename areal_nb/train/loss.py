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

import functools

from torch import Tensor

from .policy_loss import LossTerms, policy_loss_terms

__all__ = ["LossTerms", "ppo_actor_loss", "ppo_loss_terms"]


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
        eps_clip=eps_clip,
        eps_clip_higher=eps_clip_higher,
        c_clip=c_clip,
        prox_logprobs=prox_logprobs,
        behave_imp_weight_cap=behave_imp_weight_cap,
        entropy=entropy,
        normalizer=normalizer,
    )
    return terms.loss, terms.stats


# `ppo_actor_loss` with the per-token values kept (for loss inspection): the token-level PPO
# objective of `policy_loss.policy_loss_terms` (its knobs keyword-only).
ppo_loss_terms = functools.partial(policy_loss_terms, importance_level="token", policy_loss="ppo")

"""`credit="leaf"` advantages written out from their definition, one row and one token at a time
in plain Python floats: the oracle of tests/train/test_credit.py. It shares no code with
`areal_nb.train.advantages` (no tensor ops, no group index, no reverse cumsum), so a slip in the
trainer's vectorised version shows up as a difference instead of being copied into the oracle.

The definition (AReaL's rule, `compute_advantages`' docstring), for row b with reward r_b:
  score_b = clip((r_b + bias) · scaling, ±clip), then with `reward_norm` "group" / "batch"
            (score_b − mean) / (std + eps) over the row's group / the batch (std unbiased;
            a pool of one has std 1);
  kl_t    = −kl_ctl · clamp(KL estimate of (old or sampled log-prob − reference log-prob), ±10)
            on generated tokens (loss_mask ∧ attention_mask), 0 elsewhere;
  reward_t = kl_t, plus score_b on the row's last generated token;
  advantage_t = Σ_{t' ≥ t} reward_t' on generated tokens, 0 elsewhere; with `adv_norm="batch"`
            (advantage − mean) / (std + eps) over all generated tokens of the batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def _normalized(values: list[float], pools: list[Any], eps: float) -> list[float]:
    """Each value minus its pool's mean, over the pool's unbiased std plus eps (std 1 alone)."""
    out = []
    for value, pool in zip(values, pools, strict=True):
        members = [v for v, p in zip(values, pools, strict=True) if p == pool]
        mean = sum(members) / len(members)
        spread = sum((v - mean) ** 2 for v in members)
        std = math.sqrt(spread / (len(members) - 1)) if len(members) > 1 else 1.0
        out.append((value - mean) / (std + eps))
    return out


def _kl(logprob: float, ref_logprob: float, estimator: str) -> float:
    log_ratio = logprob - ref_logprob
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio**2
    else:  # k3
        kl = math.exp(-log_ratio) - 1.0 + log_ratio
    return min(max(kl, -10.0), 10.0)


def compute_advantages(batch: dict[str, Tensor], cfg: Any, group_ids: Any = None) -> dict[str, Tensor]:
    """`advantages`, `scores`, `token_rewards`, `kl_rewards`, `loss_mask` of a `[B, L]` batch
    under the leaf rule above, as float32 tensors; `group_ids` (or the batch's) name the groups."""
    rewards = batch["rewards"].flatten().tolist()
    generated = batch["loss_mask"].bool()
    if "attention_mask" in batch:
        generated = generated & batch["attention_mask"].bool()
    mask: list[list[bool]] = generated.tolist()
    ids = batch.get("group_ids") if group_ids is None else group_ids
    groups = ids.flatten().tolist() if isinstance(ids, Tensor) else ids  # read by "group" only

    scores = [
        min(max((r + cfg.reward_bias) * cfg.reward_scaling, -cfg.reward_clip), cfg.reward_clip)
        for r in rewards
    ]
    if cfg.reward_norm == "group":
        scores = _normalized(scores, groups, cfg.norm_eps)
    elif cfg.reward_norm == "batch":
        scores = _normalized(scores, [0] * len(scores), cfg.norm_eps)

    kl_rewards = [[0.0] * len(row) for row in mask]
    if cfg.kl_ctl > 0:
        logprobs = batch.get("old_logprobs", batch["logprobs"]).tolist()
        ref = batch["ref_logprobs"].tolist()
        for b, row in enumerate(mask):
            for t, is_generated in enumerate(row):
                if is_generated:
                    kl_rewards[b][t] = -cfg.kl_ctl * _kl(logprobs[b][t], ref[b][t], cfg.kl_estimator)

    token_rewards = [list(row) for row in kl_rewards]
    advantages = []
    for b, row in enumerate(mask):
        positions = [t for t, is_generated in enumerate(row) if is_generated]
        if positions:
            token_rewards[b][positions[-1]] += scores[b]
        to_go, row_advantages = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            to_go += token_rewards[b][t]
            if row[t]:
                row_advantages[t] = to_go
        advantages.append(row_advantages)

    if cfg.adv_norm == "batch":
        trained = [
            a
            for row, flags in zip(advantages, mask, strict=True)
            for a, f in zip(row, flags, strict=True)
            if f
        ]
        mean = sum(trained) / len(trained)
        spread = sum((a - mean) ** 2 for a in trained)
        std = math.sqrt(spread / (len(trained) - 1)) if len(trained) > 1 else 1.0
        advantages = [
            [(a - mean) / (std + cfg.norm_eps) if f else 0.0 for a, f in zip(row, flags, strict=True)]
            for row, flags in zip(advantages, mask, strict=True)
        ]

    def tensor(values: list[Any]) -> Tensor:
        return torch.tensor(values, dtype=torch.float32)

    return {
        "advantages": tensor(advantages),
        "scores": tensor(scores),
        "token_rewards": tensor(token_rewards),
        "kl_rewards": tensor(kl_rewards),
        "loss_mask": generated,
    }

"""Rewards → per-token advantages for GRPO (no critic, γ = λ = 1).

Credit (`GRPOConfig.credit`): "leaf" trains every generated token of a row on the row's reward
(a concat row: the leaf's, for all of its turns); "turn" trains each token on the discounted
return of the turn that generated it (`turn_returns`), normalised per turn (`turn_scores`).

Layout: every `[B, L]` tensor is indexed by *token position*: position t of `loss_mask`,
`logprobs`, `advantages` refers to token t itself (not to the logit at t that predicts t+1).

Grouping (unlike AReaL's fixed contiguous slices): a group is the set of rows with the same group id,
wherever they sit in the batch and however many there are. A multi-turn `individual` export
gives an episode several rows, and episodes of one prompt different row counts; the group
statistics are still exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import InvalidArgumentError, TrainBatchError

Level = Literal["group", "batch"] | None


@dataclass
class RewardShaping:
    """score = clip((reward + bias) * scaling, -clip, clip) (AReaL's order: bias first)."""

    scaling: float = 1.0
    bias: float = 0.0
    clip: float = 20.0

    def __call__(self, rewards: Tensor) -> Tensor:
        return ((rewards.float() + self.bias) * self.scaling).clamp(-self.clip, self.clip)


def group_index(group_ids: Tensor | Sequence[Any], n_rows: int) -> Tensor:
    """Dense ids 0..G-1, one per row, from arbitrary ids (ints, strings; any order)."""
    if isinstance(group_ids, Tensor):
        ids = group_ids.flatten()
        if ids.numel() != n_rows:
            raise TrainBatchError(f"group_ids has {ids.numel()} entries for {n_rows} rows")
        return torch.unique(ids, return_inverse=True)[1]
    listed = list(group_ids)
    if len(listed) != n_rows:
        raise TrainBatchError(f"group_ids has {len(listed)} entries for {n_rows} rows")
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(g, len(dense)) for g in listed], dtype=torch.long)


def group_normalize(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Any] | None = None,
    mean_level: Level = "group",
    std_level: Level = "group",
    eps: float = 1e-5,
    std_unbiased: bool = True,
) -> Tensor:
    """(r − mean) / (std + eps) with mean and std taken per group, over the batch, or not at all.

    - `mean_level=None`: mean 0. `std_level=None`: std 1 and eps 0 (only centring).
    - The std is taken around the chosen mean (AReaL's definition).
    - A group of one row has std 1 (there is no spread to measure), so with a group mean its
      advantage is exactly 0: a prompt sampled once teaches nothing relative to itself.
    Returns float32 `[B]`.
    """
    x = rewards.detach().double().flatten()
    n = x.numel()
    if n == 0:
        return rewards.float().flatten()
    for name, level in (("mean_level", mean_level), ("std_level", std_level)):
        if level not in ("group", "batch", None):
            raise InvalidArgumentError(f"{name} must be 'group', 'batch' or None, got {level!r}")
    if "group" not in (mean_level, std_level):
        gid = torch.zeros(n, dtype=torch.long, device=x.device)
    elif group_ids is None:
        raise InvalidArgumentError(
            "group normalisation needs group_ids: one id per row (rows need not be contiguous)"
        )
    else:
        gid = group_index(group_ids, n).to(x.device)
    n_groups = int(gid.max()) + 1
    group_count = torch.bincount(gid, minlength=n_groups).double()

    def per_row_sum(values: Tensor, level: str) -> Tensor:
        if level == "batch":
            return values.sum().expand(n)
        return torch.zeros(n_groups, dtype=values.dtype, device=x.device).index_add(0, gid, values)[gid]

    def per_row_count(level: str) -> Tensor:
        return (
            torch.full((n,), float(n), dtype=torch.double, device=x.device)
            if level == "batch"
            else group_count[gid]
        )

    mean = (
        torch.zeros_like(x) if mean_level is None else per_row_sum(x, mean_level) / per_row_count(mean_level)
    )
    if std_level is None:
        std, eps = torch.ones_like(x), 0.0
    else:
        count = per_row_count(std_level)
        denom = count - 1 if std_unbiased else count
        sq = per_row_sum((x - mean) ** 2, std_level)
        std = torch.where(count > 1, (sq / denom.clamp(min=1)).sqrt(), torch.ones_like(x))
    return ((x - mean) / (std + eps)).float()


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token KL(π‖π_ref) estimate from sampled-token log-probs, clamped to ±10.

    k1 = log r, k2 = ½ (log r)², k3 = exp(−log r) − 1 + log r, with log r = logp − ref_logp.
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio**2
    elif estimator == "k3":
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise InvalidArgumentError(f"kl estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    return kl.clamp(-10.0, 10.0)


def _masked_mean_std(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    count = mask.sum()
    mean = (x * mask).sum() / count.clamp(min=1)
    var = (((x - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    return mean, var.sqrt() if count > 1 else torch.ones_like(mean)


def shape_and_normalize(values: Tensor, pools: Callable[[], Any], cfg: Any) -> Tensor:
    """`RewardShaping` of `values`, then the baseline of `cfg.adv_estimator` (`adv_estimators.py`)
    at `cfg.reward_norm`'s level: "group" over the pools `pools()` gives (asked only then), "batch"
    over all of them, None: as shaped. One rule for both credits."""
    from .adv_estimators import estimate  # (it builds on this module's group_normalize)

    score = RewardShaping(cfg.reward_scaling, cfg.reward_bias, cfg.reward_clip)(values)
    # cfg.adv_estimator: grpo (mean/std, the default), dr_grpo, rloo or reinforce_pp
    return estimate(score, pools, cfg)


# The docstring's rule step by step (score, KL rewards, credit, normalisation) for both credits:
# kept as one function so that each line can be checked against that rule in order.
def compute_advantages(
    batch: Mapping[str, Tensor] | TrainBatch,
    cfg: Any,
    group_ids: Tensor | Sequence[Any] | None = None,
    credit: str | None = None,
) -> dict[str, Tensor]:
    """Per-token advantages for a `[B, L]` batch.

    Reads `rewards [B]`, `loss_mask [B,L]`, optional `attention_mask [B,L]`; with turn credit
    also `turn_returns [B,L]` and `turn_ids [B,L]`; with `cfg.kl_ctl > 0` also `ref_logprobs
    [B,L]` and the behaviour log-probs `old_logprobs` (falls back to `logprobs`). `batch` is a
    `TrainBatch` or its tensors by name. `group_ids` (or the batch's) names each row's group.
    `cfg` is a `GRPOConfig` (any object with its reward/adv fields); `credit` overrides `cfg.credit`.

    `credit="leaf"` (AReaL's rule): shape the row reward; normalise it (`cfg.reward_norm`);
    token reward = −kl_ctl·KL on generated tokens plus the score on each row's last generated
    token; advantage at a generated token = sum of the token rewards from it to the end of its
    row (γ = λ = 1, no critic) — with kl_ctl = 0 every generated token of a row gets that row's
    score, across all of its turns. `credit="turn"`: each token gets the normalised score of its
    own turn's return (`turn_scores`) plus the KL return-to-go. Then optionally normalise over
    generated tokens of the batch (`cfg.adv_norm`).

    Returns `advantages [B,L]`, `scores` (leaf: one per row; turn: one per (row, turn) pair,
    row-major), `token_rewards [B,L]` (leaf: KL + score at the last token; turn: KL only),
    `kl_rewards`, `loss_mask`.
    """
    if isinstance(batch, TrainBatch):
        batch = batch.tensors()
    credit = getattr(cfg, "credit", "leaf") if credit is None else credit
    if credit not in ("leaf", "turn"):
        raise InvalidArgumentError(f"credit must be 'leaf' or 'turn', got {credit!r}")
    rewards = batch["rewards"].float().flatten()
    mask = batch["loss_mask"].bool()
    if "attention_mask" in batch:
        mask = mask & batch["attention_mask"].bool()
    if mask.dim() != 2 or mask.shape[0] != rewards.numel():
        raise InvalidArgumentError(
            f"loss_mask must be [B, L] with B = len(rewards) = {rewards.numel()}, got {tuple(mask.shape)}"
        )
    n_rows, length = mask.shape
    if group_ids is None:
        group_ids = batch.get("group_ids")

    if credit == "turn":
        if getattr(cfg, "overlong_max_len", None) is not None:
            raise InvalidArgumentError(
                "overlong_max_len (DAPO's overlong penalty) is defined on a row's reward: use credit='leaf'"
            )
        missing = [k for k in ("turn_returns", "turn_ids") if k not in batch]
        if missing:
            raise InvalidArgumentError(
                f"credit='turn' needs batch{missing} (per-token turn returns and turn ids, as "
                "RolloutBatch.to_tensors() and InteractionWithTokenLogpReward.to_tensor_dict() export them)"
            )
        token_score, score = turn_scores(batch["turn_returns"], batch["turn_ids"], mask, group_ids, cfg)
    else:
        if getattr(cfg, "overlong_max_len", None) is not None:  # DAPO's soft overlong penalty
            from .algorithms import overlong_penalty

            rewards = rewards + overlong_penalty(
                mask.sum(1), cfg.overlong_max_len, cfg.overlong_buffer, cfg.overlong_penalty
            ).to(rewards.device)
        score = shape_and_normalize(rewards, lambda: group_ids, cfg).to(mask.device)

    kl_rewards = torch.zeros(n_rows, length, dtype=torch.float32, device=mask.device)
    if cfg.kl_ctl > 0:
        if "ref_logprobs" not in batch:
            raise TrainBatchError("kl_ctl > 0 needs batch['ref_logprobs'] (log-probs of a reference model)")
        logp = batch.get("old_logprobs", batch["logprobs"])
        kl_rewards = -cfg.kl_ctl * kl_estimate(logp, batch["ref_logprobs"], cfg.kl_estimator) * mask

    if credit == "turn":
        token_rewards = kl_rewards.clone()
        # Each token's own turn score, plus the KL penalty from it to the end of the row.
        advantages = (token_score + kl_rewards.flip(1).cumsum(1).flip(1)) * mask
    else:
        positions = torch.arange(length, device=mask.device).expand(n_rows, length)
        last_generated = torch.where(mask, positions, -1).max(dim=1).values  # -1: row has nothing to train
        has_tokens = last_generated >= 0
        token_rewards = kl_rewards.clone()
        rows = torch.arange(n_rows, device=mask.device)[has_tokens]
        token_rewards[rows, last_generated[has_tokens]] += score[has_tokens]

        # Reverse cumulative sum: the return from each position to the end of the row. Prompt and
        # tool-output positions hold zero reward, so earlier turns see later turns' rewards.
        advantages = token_rewards.flip(1).cumsum(1).flip(1) * mask

    if cfg.adv_norm not in (None, "batch"):
        raise InvalidArgumentError(f"adv_norm must be 'batch' or None, got {cfg.adv_norm!r}")
    if (
        cfg.adv_norm == "batch" or getattr(cfg, "adv_estimator", None) == "reinforce_pp"
    ):  # REINFORCE++: always
        mean, std = _masked_mean_std(advantages, mask)
        advantages = (advantages - mean) / (std + cfg.norm_eps) * mask

    return {
        "advantages": advantages,
        "scores": score,
        "token_rewards": token_rewards,
        "kl_rewards": kl_rewards,
        "loss_mask": mask,
    }


def turn_scores(
    turn_returns: Tensor,
    turn_ids: Tensor,
    loss_mask: Tensor,
    group_ids: Tensor | Sequence[Any] | None,
    cfg: Any,
) -> tuple[Tensor, Tensor]:
    """Turn credit: the normalised score of each generated token's own turn.

    With v[b,k] the return of turn k in row b (one value per (row, turn) pair, however many
    tokens the turn has) and g(b) the row's group:

        s[b,k] = clip((v[b,k] + bias) · scaling, ±clip)                    (RewardShaping)
        A[b,k] = (s[b,k] − mean_P s) / (std_P s + eps)                      (std unbiased; a
                                                                             pool of one: A = 0)
        P = {(b', k) : g(b') = g(b), row b' holds turn k}   reward_norm="group", credit_norm="turn"
        P = {(b', k'): g(b') = g(b)}                        reward_norm="group", credit_norm="episode"
        P = every (row, turn) pair of the batch             reward_norm="batch";  A = s for None

    and token t of row b gets A[b, turn_ids[b,t]]. "turn" compares a first reply with the group's
    other first replies and a second reply with the other second replies; "episode" pools all
    turns of the group's episodes. A turn shared by several rows (a concat tree's root in each
    leaf's row) is one pair per row. With one turn per row (an `individual` export) and
    "episode", this is exactly the leaf rule's group normalisation.

    Returns (token scores [B, L], zero off the mask; the scores of the pairs, row-major).
    """
    mask = loss_mask.bool()
    turns = turn_ids.long().to(mask.device)
    if turn_returns.shape != mask.shape or turns.shape != mask.shape:
        raise InvalidArgumentError(
            f"turn_returns {tuple(turn_returns.shape)} and turn_ids {tuple(turns.shape)} must match loss_mask "
            f"{tuple(mask.shape)}"
        )
    if bool((mask & (turns < 0)).any()):
        raise InvalidArgumentError(
            "a generated token (loss_mask 1) has turn_id -1; turn credit needs every trained token's turn"
        )
    n_rows, length = mask.shape
    n_turns = int(turns[mask].max()) + 1 if bool(mask.any()) else 1
    slot = torch.arange(n_rows, device=mask.device).unsqueeze(1) * n_turns + turns.clamp(min=0)
    sums = torch.zeros(n_rows * n_turns, dtype=torch.double, device=mask.device)
    sums.index_add_(0, slot[mask], turn_returns.to(mask.device).double()[mask])
    counts = torch.bincount(slot[mask], minlength=n_rows * n_turns).double()
    present = counts > 0
    pair = torch.arange(n_rows * n_turns, device=mask.device)[present]
    pair_row, pair_turn = pair // n_turns, pair % n_turns

    returns = (sums[present] / counts[present]).float()  # one per (row, turn): all its tokens hold the same

    def pools() -> Tensor:
        if group_ids is None:
            raise InvalidArgumentError(
                "group normalisation needs group_ids: one id per row (rows need not be contiguous)"
            )
        gid = group_index(group_ids, n_rows).to(mask.device)[pair_row]
        return gid * n_turns + pair_turn if getattr(cfg, "credit_norm", "turn") == "turn" else gid

    score = shape_and_normalize(returns, pools, cfg).to(mask.device)
    per_slot = torch.zeros(n_rows * n_turns, dtype=torch.float32, device=mask.device)
    per_slot[present] = score
    return per_slot[slot] * mask, score

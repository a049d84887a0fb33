"""How a shaped score becomes an advantage: `actor.adv_estimator` (grpo | dr_grpo | rloo | reinforce_pp).

Each works on the scores `advantages.shape_and_normalize` receives — one per row with credit
"leaf", one per (row, turn) with credit "turn" — and on the same pools (a GRPO group, or a group's
turn index), so the credit and discount rules stay what they are. The pool level follows
`actor.reward_norm` ("group": the pools; "batch": one pool of everything; None: no baseline).
For r_i in a pool P of n scores:

- grpo:          A_i = (r_i − mean_P r) / (std_P r + eps)   (std unbiased; n = 1: A = 0)
- dr_grpo:       A_i = r_i − mean_P r                        (Dr. GRPO: no std division)
- rloo:          A_i = r_i − (Σ_{j≠i} r_j) / (n − 1) = n/(n−1) · (r_i − mean_P r)   (n = 1: A = 0)
- reinforce_pp:  A_i = r_i here; the returns-to-go are then normalised over the batch's
                 generated tokens, (G_t − mean G) / (std G + eps) (REINFORCE++).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from areal_nb.errors import ConfigError

from .advantages import group_index, group_normalize


def estimate(score: Tensor, pools: Callable[[], Any], cfg: Any) -> Tensor:
    """The advantage of each score under `cfg.adv_estimator` (float32, shape of `score`)."""
    estimator = getattr(cfg, "adv_estimator", None) or "grpo"
    level = cfg.reward_norm
    if level not in ("group", "batch", None):
        raise ConfigError(f"reward_norm must be 'group', 'batch' or None, got {level!r}")
    if estimator == "reinforce_pp" or level is None:
        return score
    ids = pools() if level == "group" else None
    if estimator == "grpo":
        return group_normalize(score, ids, level, level, eps=cfg.norm_eps)
    if estimator == "dr_grpo":
        return group_normalize(score, ids, level, None)
    if estimator == "rloo":
        return _leave_one_out(score, ids)
    raise ConfigError(f"adv_estimator must be 'grpo', 'dr_grpo', 'rloo' or 'reinforce_pp', got {estimator!r}")


def _leave_one_out(score: Tensor, pool_ids: Any | None) -> Tensor:
    """r_i minus the mean of the other scores of its pool (None: the whole batch); 0 alone."""
    x = score.detach().double().flatten()
    n = x.numel()
    gid = (
        group_index(pool_ids, n).to(x.device)
        if pool_ids is not None
        else torch.zeros(n, dtype=torch.long, device=x.device)
    )
    n_pools = int(gid.max()) + 1 if n else 0
    sums = torch.zeros(n_pools, dtype=x.dtype, device=x.device).index_add(0, gid, x)[gid]
    counts = torch.bincount(gid, minlength=n_pools).double()[gid]
    others = (sums - x) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, x - others, torch.zeros_like(x)).float()

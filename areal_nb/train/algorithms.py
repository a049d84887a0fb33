"""The algorithms a researcher compares, as presets of the trainer's knobs.

`actor.algorithm` names a preset; each preset is a set of values for the knobs marked "preset"
in `GRPOConfig` (`_PRESET_KNOBS`). A knob left at None takes its preset's value when the config is
made; any explicit value wins. The variants themselves are pure functions beside this module:

- advantages (`adv_estimators.py`): grpo, dr_grpo, rloo, reinforce_pp, on top of the credit and
  discount rules of `advantages.py`;
- the policy loss (`policy_loss.py`): token (PPO) or sequence (GSPO) importance ratio, PPO's
  clipped surrogate or CISPO's clipped stop-gradient weight, and the aggregation over tokens;
- train-inference mismatch correction (`mismatch.py`): TIS / MIS, per token or per sequence;
- DAPO's dynamic sampling (`informative_groups` here; the Session refills the batch) and soft
  overlong penalty (`overlong_penalty` here).

| preset | advantages | ratio | objective | aggregation | clip (low, high) | other |
|---|---|---|---|---|---|---|
| grpo | group mean/std | token | PPO | token mean | 0.2, 0.2 | (the trainer as it always ran) |
| dr_grpo | group mean | token | PPO | sequence sums / constant | 0.2, 0.2 | |
| dapo | group mean/std | token | PPO | token mean | 0.2, 0.28 | dynamic sampling |
| gspo | group mean/std | sequence | PPO | sequence mean of token means | 3e-4, 4e-4 | |
| cispo | group mean/std | token | CISPO | token mean | 1.0, 4.0 (weight ≤ 5) | |
| rloo | leave-one-out mean | token | PPO | token mean | 0.2, 0.2 | |
| reinforce_pp | batch-normalised returns | token | PPO | token mean | 0.2, 0.2 | |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, get_args

import torch
from torch import Tensor

from areal_nb.errors import ConfigError, InvalidArgumentError

from .config import (
    Algorithm,
)

# The algorithms, as `GRPOConfig`'s `Literal` type names them (checked there, when a config is made).
ALGORITHMS = get_args(Algorithm)

_GRPO = {
    "adv_estimator": "grpo",
    "loss_agg": "token_mean",
    "importance_level": "token",
    "policy_loss": "ppo",
    "dynamic_sampling": False,
    "eps_clip": 0.2,
    "eps_clip_higher": None,
}

# Each preset's knobs (the keys of every entry: _PRESET_KNOBS) and where it comes from.
PRESETS: dict[str, dict[str, Any]] = {
    # GRPO (Shao et al. 2024, DeepSeekMath) as this trainer always ran it: token-level mean over
    # the minibatch, as AReaL does (the paper's own average is `loss_agg: seq_mean_token_mean`).
    "grpo": dict(_GRPO),
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std division, no
    # length normalisation (sequence sums over a constant).
    "dr_grpo": {**_GRPO, "adv_estimator": "dr_grpo", "loss_agg": "seq_sum_norm"},
    # DAPO (Yu et al. 2025): clip-higher, token-level loss, dynamic sampling (the soft overlong
    # penalty needs the task's length: set actor.overlong_max_len).
    "dapo": {**_GRPO, "eps_clip_higher": 0.28, "dynamic_sampling": True},
    # GSPO (Zheng et al. 2025): the sequence's length-normalised importance ratio, clipped per sequence.
    "gspo": {
        **_GRPO,
        "importance_level": "sequence",
        "loss_agg": "seq_mean_token_mean",
        "eps_clip": 3e-4,
        "eps_clip_higher": 4e-4,
    },
    # CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight; no lower
    # bound (eps_clip 1.0: the weight may fall to 0), the upper bound is this package's choice.
    "cispo": {**_GRPO, "policy_loss": "cispo", "eps_clip": 1.0, "eps_clip_higher": 4.0},
    # RLOO (Ahmadian et al. 2024, "Back to Basics"): the other samples' mean reward as the baseline.
    "rloo": {**_GRPO, "adv_estimator": "rloo"},
    # REINFORCE++ (Hu 2025): no group baseline; returns normalised over the batch's tokens.
    "reinforce_pp": {**_GRPO, "adv_estimator": "reinforce_pp"},
}
_PRESET_KNOBS = tuple(_GRPO)


def resolve_preset(cfg: Any) -> None:
    """Fill every preset knob of `cfg` that is None with `cfg.algorithm`'s value (in place).

    `eps_clip_higher`'s None is also "symmetric clipping": under a preset with its own upper bound
    (dapo, gspo, cispo), symmetric clipping is `eps_clip_higher = eps_clip`.
    """
    if cfg.algorithm not in PRESETS:
        raise ConfigError(f"GRPOConfig: algorithm must be one of {list(ALGORITHMS)}, got {cfg.algorithm!r}")
    for knob, value in PRESETS[cfg.algorithm].items():
        if getattr(cfg, knob) is None:
            setattr(cfg, knob, value)


def check_algorithm(cfg: Any) -> None:
    """The checks that tie algorithm knobs together (after `resolve_preset`; each knob's own type
    and bounds are `GRPOConfig`'s); ValueError naming the knob."""
    checks = [
        (
            cfg.overlong_buffer is None
            or (cfg.overlong_max_len is not None and 1 <= cfg.overlong_buffer <= cfg.overlong_max_len),
            f"overlong_buffer must be in [1, overlong_max_len] (and needs overlong_max_len), got {cfg.overlong_buffer}",
        ),
        (
            cfg.mismatch_correction is None or not cfg.use_decoupled_loss,
            (
                "mismatch_correction with use_decoupled_loss: the decoupled loss already weights every token by "
                "π_prox/π_behave (masked above behave_imp_weight_cap); use one or the other"
            ),
        ),
        (
            cfg.mismatch_correction is None or cfg.recompute_logprob,
            "mismatch_correction needs the trainer's log-probs: set recompute_logprob=true",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"GRPOConfig: {message}")


def configure(base: Any, algorithm: str | None = None, **overrides: Any) -> Any:
    """`base` (a `GRPOConfig`) under another algorithm, with `overrides`.

    The same algorithm: `base` with `overrides` (base's clip ranges and other knobs kept). Another
    algorithm: base's non-preset knobs (learning rate, credit, ...) with the new preset's values for
    the preset knobs, then `overrides`. Unknown knob names raise ConfigError.
    """
    algorithm = base.algorithm if algorithm is None else algorithm
    names = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown actor knob(s) {unknown}; GRPOConfig has {sorted(names)}")
    if algorithm == base.algorithm:
        return dataclasses.replace(base, **overrides)
    reset = {knob: None for knob in _PRESET_KNOBS}
    return dataclasses.replace(base, **{**reset, "algorithm": algorithm, **overrides})


def informative_groups(rewards: Sequence[float] | Tensor, group_ids: Sequence[Any]) -> set[Any]:
    """DAPO's dynamic-sampling filter: the groups whose rewards are not all equal.

    A group whose samples all scored the same has zero advantage under any group baseline, so it
    adds nothing to the gradient but dilutes the batch. Returns the ids of the other groups.
    """
    values = rewards.tolist() if isinstance(rewards, Tensor) else list(rewards)
    if len(values) != len(group_ids):
        raise InvalidArgumentError(f"{len(values)} rewards for {len(group_ids)} group ids")
    seen: dict[Any, set[float]] = {}
    for gid, value in zip(group_ids, values, strict=True):
        seen.setdefault(gid, set()).add(float(value))
    return {gid for gid, distinct in seen.items() if len(distinct) > 1}


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int | None = None, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, added to a row's reward; `lengths`: its generated tokens.

        R(|y|) = 0                                   |y| ≤ L_max − L_cache
               = ((L_max − L_cache) − |y|) / L_cache  L_max − L_cache < |y| ≤ L_max
               = −1                                  |y| > L_max

    times `factor`; L_cache = `buffer` (None: L_max // 5, at least 1).
    """
    cache = max(max_len // 5, 1) if buffer is None else buffer
    lengths = lengths.float()
    ramp = ((max_len - cache) - lengths) / cache
    penalty = torch.where(lengths <= max_len - cache, torch.zeros_like(lengths), ramp)
    penalty = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)
    return factor * penalty

"""Training curves as plain series, read from `session.history` (one row per step), and the
warning the dashboard shows when the latest step's groups mostly carried no learning signal."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from areal_nb.rollout.learning_signal import no_signal_advice

# (history column, label); columns missing from a session's history are skipped.
METRICS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward"),
    ("zero_signal_groups", "groups without signal"),  # equal rewards in the group: advantage 0
    ("eval_accuracy", "held-out accuracy"),  # evaluate(): first reply rewarded
    ("eval_reward", "held-out reward"),  # evaluate(): mean episode return of the greedy agent
    ("loss", "loss"),
    ("clip_frac", "clip fraction"),
    ("approx_kl", "approx KL"),
    ("kl_ref", "KL to reference"),  # only with actor.kl_ctl > 0
    ("entropy", "entropy"),
    ("staleness_mean", "staleness"),
    ("mismatch_kl_k3", "engine/trainer KL (k3)"),  # the recorded vs recomputed log-probs (train/mismatch.py)
    (
        "dynamic_sampling_dropped_groups",
        "groups dropped (dynamic sampling)",
    ),  # only with actor.dynamic_sampling
    ("truncated_share", "replies cut at max_new_tokens"),
    ("reply_len_mean", "reply length (tokens)"),
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("train_tokens_per_s", "train tokens/s"),
)

# Per-agent reward columns of a multi-agent run (`reward_mean/solver`, ...).
_AGENT_REWARD_PREFIX = "reward_mean/"


@dataclass
class Series:
    column: str
    label: str
    steps: list[int]
    values: list[float]  # NaN where not measured at that step (e.g. eval every k steps)

    @property
    def points(self) -> list[tuple[int, float]]:
        return [(s, v) for s, v in zip(self.steps, self.values, strict=True) if not math.isnan(v)]

    @property
    def last(self) -> float | None:
        pts = self.points
        return pts[-1][1] if pts else None


def history_series(history: Any) -> list[Series]:
    """One series per known metric column of a history DataFrame (or list of dicts)."""
    records = _records(history)
    steps = [int(r.get("step", i)) for i, r in enumerate(records)]
    out = []
    for column, label in METRICS:
        if not any(column in r for r in records) and records:
            continue
        values = [_num(r.get(column)) for r in records]
        out.append(Series(column, label, steps, values))
        if column == "reward_mean":  # several agents: each one's reward beside the total
            for agent_column in _agent_columns(records):
                agent = agent_column.split("/", 1)[1]
                values = [_num(r.get(agent_column)) for r in records]
                out.append(Series(agent_column, f"reward · {agent}", steps, values))
    return out


def signal_warning(history: Any) -> str | None:
    """What to try, when most groups of the latest step carried no signal (else None)."""
    records = _records(history)
    return no_signal_advice(records[-1]) if records else None


def _agent_columns(records: list[dict]) -> list[str]:
    """The `reward_mean/<agent>` columns a multi-agent run logs, in order of first appearance."""
    seen: dict[str, None] = {}
    for r in records:
        for key in r:
            if isinstance(key, str) and key.startswith(_AGENT_REWARD_PREFIX):
                seen.setdefault(key, None)
    return list(seen)


def _records(history: Any) -> list[dict]:
    if history is None:
        return []
    if hasattr(history, "to_dict"):
        return history.to_dict("records")
    return [dict(r) for r in history]


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def history_length(history: Any) -> int:
    return 0 if history is None else len(history)

"""Can a batch teach anything? Three figures per training step, and what to try when it cannot.

Under a group baseline (GRPO, Dr. GRPO, RLOO, ...) a group whose episodes all scored the same
has zero advantage on every token: it adds nothing to the gradient. When every group is like
that, the step's loss and gradient norm are exactly 0 and the policy does not move, and nothing
else says why. `signal_stats` gives the columns of `session.history`:

- `zero_signal_groups`: the share of groups whose returns are all equal (no signal). A group is
  a (prompt, agent) pair, as the trainer's baselines and DAPO's dynamic sampling take it; its
  values are the agent's episode returns (its calls' rewards summed, before discount);
- `truncated_share`: the share of replies (LLM calls) the engine cut at the token budget
  (stop reason "length": `rollout.max_new_tokens`, or the context window);
- `reply_len_mean`: the mean reply length in generated tokens.

All three count the accepted episodes only (NaN when there are none). `no_signal_advice` is
what the progress bar, the dashboard and the Session's warning say when most groups carry no
signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import RolloutBatch

ZERO_SIGNAL = "zero_signal_groups"
_TRUNCATED = "truncated_share"
_REPLY_LEN = "reply_len_mean"

_MOSTLY = 0.5  # "most groups" / "many replies": a share above this


def group_returns(batch: RolloutBatch) -> dict[tuple[int, str | None], list[float]]:
    """Each (prompt, agent) group's returns: one per accepted episode in which the agent made a call."""
    out: dict[tuple[int, str | None], list[float]] = {}
    for i, episode in enumerate(batch.episodes):
        if episode.accepted:
            for agent, value in batch.agent_returns(i).items():
                out.setdefault((episode.group_id, agent), []).append(value)
    return out


def informative(returns: list[float]) -> bool:
    """Whether a group's returns differ (else its advantages are all zero)."""
    return len(set(returns)) > 1


def signal_stats(batch: RolloutBatch) -> dict[str, float]:
    """`zero_signal_groups`, `truncated_share` and `reply_len_mean` of `batch` (see the module)."""
    groups = list(group_returns(batch).values())
    replies = [
        call.model_response
        for i, episode in enumerate(batch.episodes)
        if episode.accepted
        for call in batch.calls(i)
        if call.model_response is not None
    ]
    return {
        ZERO_SIGNAL: sum(not informative(g) for g in groups) / len(groups) if groups else math.nan,
        _TRUNCATED: sum(r.stop_reason == "length" for r in replies) / len(replies) if replies else math.nan,
        _REPLY_LEN: sum(r.output_len for r in replies) / len(replies) if replies else math.nan,
    }


def _share(stats: Mapping[str, Any], column: str) -> float:
    try:
        return float(stats.get(column, math.nan))
    except (TypeError, ValueError):
        return math.nan


def no_signal(stats: Mapping[str, Any]) -> bool:
    """Most groups of the step carried no signal (NaN, a missing column: no)."""
    return _share(stats, ZERO_SIGNAL) > _MOSTLY


def no_signal_advice(stats: Mapping[str, Any]) -> str | None:
    """What to try when most groups of a step carried no signal (one stats row); None otherwise."""
    if not no_signal(stats):
        return None
    advice = (
        f"{_share(stats, ZERO_SIGNAL):.0%} of the groups had equal rewards in every episode, so their "
        "advantages are 0 and they teach nothing (with all of them, loss and grad norm are 0). Try a "
        "larger rollout.group_size, actor.dynamic_sampling=True (DAPO: such groups are dropped and "
        "refilled), or easier (or harder, if all succeed) prompts"
    )
    truncated = _share(stats, _TRUNCATED)
    if truncated > _MOSTLY:
        advice += (
            f"; {truncated:.0%} of the replies were cut at the token budget (mean length "
            f"{_share(stats, _REPLY_LEN):.1f} tokens): give them a larger rollout.max_new_tokens"
        )
    return advice + "."


def progress_note(stats: Mapping[str, Any]) -> dict[str, str]:
    """A short form of the advice for a progress bar's postfix ({} when there is signal)."""
    if not no_signal(stats):
        return {}
    note = {
        "no_signal": f"{_share(stats, ZERO_SIGNAL):.0%} of groups: try a larger group_size or actor.dynamic_sampling"
    }
    if _share(stats, _TRUNCATED) > _MOSTLY:
        note["truncated"] = f"{_share(stats, _TRUNCATED):.0%}: try a larger max_new_tokens"
    return note

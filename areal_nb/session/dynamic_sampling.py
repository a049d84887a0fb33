"""DAPO's dynamic sampling: groups whose episodes all scored the same are dropped, the batch refilled.

Under any group baseline such a group's advantages are all zero: it costs a training forward and
dilutes the token mean without teaching anything. `refill_informative` keeps the groups whose
accepted episodes' returns differ (`train.algorithms.informative_groups`) and rolls out as many
new prompts as were dropped, at most `max_rounds` times; what is still missing after that stays
missing (the step trains on fewer groups). If no group at all is informative, the last rollout is
trained on as it is (its advantages are zero; the step still moves the version). The counts go
into the batch's stats and so into `session.history`: `dynamic_sampling_dropped_groups`,
`dynamic_sampling_rounds`, `dynamic_sampling_groups` (groups trained on) and `dynamic_sampling_exhausted` (1: the bound was
reached with the batch not full).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.learning_signal import group_returns
from areal_nb.train.algorithms import informative_groups


def informative_episodes(batch: RolloutBatch) -> tuple[list, int]:
    """The episodes of `batch`'s informative groups, and the number of groups dropped.

    With several agents a prompt's group is informative when some agent's returns differ among
    its episodes (the trainer's baselines are per (prompt, agent)); one agent: its episode returns.
    The same groups count as carrying signal in the history's `zero_signal_groups`.
    """
    groups = group_returns(batch)
    keys = [key for key, returns in groups.items() for _ in returns]
    informative = informative_groups([value for returns in groups.values() for value in returns], keys)
    keep = {prompt for prompt, _ in informative}
    return [ep for ep in batch.episodes if ep.group_id in keep], len(batch.groups) - len(keep)


def refill_informative(
    batch: RolloutBatch, rollout: Callable[[int], RolloutBatch | None], max_rounds: int
) -> RolloutBatch:
    """`batch` with its uninformative groups dropped and refilled by `rollout(n_prompts)`."""
    target = len(batch.groups)
    kept, dropped = informative_episodes(batch)
    rounds, last = 0, batch
    while len({ep.group_id for ep in kept}) < target and rounds < max_rounds:
        missing = target - len({ep.group_id for ep in kept})
        got = rollout(missing)
        rounds += 1
        if got is None:  # (a rank ≠ 0: it never refills)
            break
        last = got
        more, more_dropped = informative_episodes(last)
        kept += more
        dropped += more_dropped
    n_groups = len({ep.group_id for ep in kept})
    stats = {
        **batch.stats,
        "dynamic_sampling_dropped_groups": dropped,
        "dynamic_sampling_rounds": rounds,
        "dynamic_sampling_groups": n_groups,
        "dynamic_sampling_exhausted": float(n_groups < target),
    }
    if not kept:  # nothing informative: train on the last rollout as it is
        return dataclasses.replace(
            last, stats={**last.stats, **stats, "dynamic_sampling_groups": len(last.groups)}
        )
    return dataclasses.replace(batch, episodes=kept, stats=stats, version=last.version)

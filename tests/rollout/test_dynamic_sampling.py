"""DAPO's dynamic sampling: constant-reward groups dropped, the batch refilled within a bound, counted."""

from __future__ import annotations

import itertools

from areal_nb.rollout.batch import RolloutBatch
from areal_nb.session.dynamic_sampling import refill_informative

from .test_batch_tensors import episode

_ids = itertools.count(100)


def group(rewards):
    gid = next(_ids)
    return [episode(f"g{gid}-{i}", [r], gid, i, "hf") for i, r in enumerate(rewards)]


def batch_of(*groups):
    return RolloutBatch([ep for g in groups for ep in g], stats={"rollout_s": 1.0})


def test_constant_groups_are_dropped_and_refilled_from_new_rollouts():
    first = batch_of(group([1, 0]), group([1, 1]), group([0, 0]), group([0.5, 1]))
    asked = []
    refills = iter([batch_of(group([0, 0]), group([1, 0])), batch_of(group([0.2, 0.1]))])

    def rollout(n):
        asked.append(n)
        return next(refills)

    out = refill_informative(first, rollout, max_rounds=3)
    assert asked == [2, 1]  # exactly the missing groups, each time
    assert len(out.groups) == 4
    assert all(
        len({out.episode_return(i) for i, ep in enumerate(out.episodes) if ep.group_id == g}) > 1
        for g in out.groups
    )
    assert out.stats["dynamic_sampling_dropped_groups"] == 3 and out.stats["dynamic_sampling_rounds"] == 2
    assert out.stats["dynamic_sampling_exhausted"] == 0.0 and out.stats["rollout_s"] == 1.0
    assert out.to_tensors().input_ids.shape[0] == 8


def test_refill_stops_at_the_bound_and_says_so():
    first = batch_of(group([1, 1]), group([1, 0]))
    asked = []

    def rollout(n):
        asked.append(n)
        return batch_of(*[group([0, 0]) for _ in range(n)])

    out = refill_informative(first, rollout, max_rounds=2)
    assert asked == [1, 1]
    assert len(out.groups) == 1 and out.stats["dynamic_sampling_exhausted"] == 1.0
    assert out.stats["dynamic_sampling_dropped_groups"] == 3 and out.stats["dynamic_sampling_groups"] == 1
    assert refill_informative(first, rollout, max_rounds=0).stats["dynamic_sampling_rounds"] == 0


def test_nothing_informative_trains_the_last_rollout_as_it_is():
    last = batch_of(group([0, 0]))
    out = refill_informative(batch_of(group([1, 1])), lambda n: last, max_rounds=1)
    assert [ep.group_id for ep in out.episodes] == [ep.group_id for ep in last.episodes]
    assert (
        out.stats["dynamic_sampling_dropped_groups"] == 2 and out.stats["dynamic_sampling_exhausted"] == 1.0
    )

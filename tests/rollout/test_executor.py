import asyncio

import pytest

from areal_nb.api import RolloutWorkflow
from areal_nb.rollout.executor import RolloutExecutor, StalenessLimitError
from areal_nb.rollout.staleness import StalenessManager


class VersionEngine:
    def __init__(self):
        self.version = 0

    def get_version(self):
        return self.version


class EchoWorkflow(RolloutWorkflow):
    """Returns {id: (data, version)}; data["fail"] makes it raise, data["none"] return None."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.started = 0

    async def arun_episode(self, engine, data):
        self.started += 1
        await asyncio.sleep(self.delay * (data.get("slow", 0)))
        if data.get("fail"):
            raise RuntimeError("agent exploded")
        if data.get("none"):
            self.last_rejection_reason = "agent returned a string"
            return None
        return {f"{data['i']}-{self.started}": (data["i"], engine.get_version())}


def make(workflow, engine, **kw):
    args = dict(group_size=2, batch_size=2, max_head_offpolicyness=0, max_concurrent=64)
    args.update(kw)
    return RolloutExecutor(workflow, engine, **args)


def test_capacity_formula_matches_reference_examples():
    m = StalenessManager(max_concurrent=10, max_staleness=2, consumer_batch_size=4)
    assert m.capacity(0) == min(10, (2 + 0 + 1) * 4)  # 10, concurrency-bound
    m.on_submit(3)
    m.on_finish(True)
    m.on_finish(False)
    assert (m.running, m.accepted, m.rejected) == (1, 1, 1)
    assert m.capacity(5) == min(10 - 1, (2 + 5 + 1) * 4 - 2)


def test_groups_come_back_in_submission_order_with_rejections_recorded():
    async def main():
        eng = VersionEngine()
        ex = make(EchoWorkflow(delay=0.01), eng, max_head_offpolicyness=5)
        ex.submit({"i": 0, "slow": 3})
        ex.submit({"i": 1, "fail": True})
        ex.submit({"i": 2, "none": True})
        groups = await ex.wait_groups(3)
        assert [g[0].group_id for g in groups] == [0, 1, 2]
        assert [len(g) for g in groups] == [2, 2, 2]
        assert all(ep.accepted for ep in groups[0])
        assert groups[1][0].rejection_reason == "RuntimeError: agent exploded"
        assert groups[2][1].rejection_reason == "agent returned a string"
        assert ex.staleness.accepted == 2 and ex.staleness.rejected == 4 and ex.staleness.running == 0

    asyncio.run(main())


def test_staleness_zero_blocks_rollouts_ahead_of_training():
    async def main():
        eng = VersionEngine()
        ex = make(EchoWorkflow(), eng, max_head_offpolicyness=0, batch_size=1)
        ex.submit({"i": 0}, explicit=False)
        ex.submit({"i": 1}, explicit=False)  # would be a second batch at version 0
        (g0,) = await ex.wait_groups(1)
        assert g0[0].accepted
        with pytest.raises(StalenessLimitError, match="max_head_offpolicyness=0"):
            await ex.wait_groups(1)
        eng.version = 1  # a training step happened
        ex.on_version_change()
        (g1,) = await ex.wait_groups(1)
        assert {ep.version_submitted for ep in g1} == {1}

    asyncio.run(main())


def test_feeder_fills_up_to_the_staleness_bound():
    async def main():
        eng = VersionEngine()
        wf = EchoWorkflow()
        ex = make(wf, eng, max_head_offpolicyness=1, batch_size=1)
        ex.set_feeder(iter({"i": i} for i in range(100)))
        await asyncio.sleep(0.05)
        # (S + v + 1) * B episodes = 2 groups of 2 at version 0, no more
        assert wf.started == 4 and ex.n_waiting == 2
        await ex.wait_groups(1)
        eng.version = 1
        ex.on_version_change()
        await asyncio.sleep(0.05)
        assert wf.started == 6
        await ex.cancel_all()

    asyncio.run(main())


def test_cancel_all_gives_budget_back():
    async def main():
        eng = VersionEngine()
        ex = make(EchoWorkflow(delay=10), eng, max_head_offpolicyness=3)
        ex.submit({"i": 0, "slow": 1})
        await asyncio.sleep(0.01)
        assert ex.staleness.running == 2
        await ex.cancel_all()
        assert ex.staleness.running == 0 and ex.n_waiting == 0

    asyncio.run(main())


def test_max_concurrent_below_group_size_is_refused():
    with pytest.raises(ValueError, match="group_size"):
        make(EchoWorkflow(), VersionEngine(), group_size=4, max_concurrent=2)


def test_explicit_rollouts_ignore_the_staleness_budget_but_not_concurrency():
    async def main():
        eng = VersionEngine()
        wf = EchoWorkflow(delay=0.01)
        ex = make(wf, eng, max_head_offpolicyness=0, batch_size=1, max_concurrent=4)
        for i in range(5):
            ex.submit({"i": i, "slow": 1})  # a notebook asking for 5 prompts at once
        await asyncio.sleep(0)
        assert ex.staleness.running == 4  # two groups of two at a time
        groups = await ex.wait_groups(5)
        assert len(groups) == 5 and all(ep.accepted for g in groups for ep in g)
        assert {ep.version_submitted for g in groups for ep in g} == {0}

    asyncio.run(main())

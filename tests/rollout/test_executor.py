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


def test_capacity_counts_queued_and_untrained_episodes():
    m = StalenessManager(max_concurrent=10, max_staleness=2, consumer_batch_size=4)
    assert m.capacity(0) == min(10, (2 + 1) * 4)  # 10, concurrency-bound
    m.on_submit(3)
    m.on_finish(True)
    m.on_finish(False)  # a rejected episode keeps its place in the queue
    assert (m.running, m.queued, m.accepted, m.rejected) == (1, 3, 1, 1)
    assert m.capacity(0) == min(10 - 1, 12 - 3)
    m.on_submit(5)  # 8 queued, 6 running
    assert m.capacity(0) == min(4, 12 - 8)
    for _ in range(6):
        m.on_finish(True)
    m.on_hand_out(4, version=0)  # a batch leaves for its training step at version 0
    assert m.capacity(0) == 12 - 4 - 4  # still counts until that step moved the version
    assert m.capacity(1) == 12 - 4  # trained
    m.on_cancel(running=0, finished=4)
    assert m.capacity(1) == 10
    m.on_submit(4)
    for _ in range(4):
        m.on_finish(False)
    m.on_hand_out(4, version=1)  # a batch of rejected episodes, never trained (Session.step rolls out again)
    assert m.capacity(1) == 12 - 4
    m.on_discard(4)
    assert m.capacity(1) == 10


def test_capacity_equals_areals_formula_when_every_version_consumed_a_full_batch():
    """AReaL: (S + v + 1)·B − (accepted + running). Same figure while each version step trained
    exactly B accepted episodes handed out in order (the case that formula assumes)."""
    S, B = 2, 4
    m = StalenessManager(max_concurrent=100, max_staleness=S, consumer_batch_size=B)
    accepted = running = 0
    for version in range(5):
        start = m.capacity(version)
        assert start == (S + version + 1) * B - (accepted + running)
        m.on_submit(start)
        running += start
        for _ in range(B):  # a batch finishes, is handed out and trained
            m.on_finish(True)
        running -= B
        accepted += B
        m.on_hand_out(B, version)
        assert m.capacity(version) == (S + version + 1) * B - (accepted + running)  # its step is pending


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


# --- the staleness bound under what a notebook really does (each would let a group start more
# than max_head_offpolicyness versions before the step that trains it) ---


async def _settle():
    for _ in range(20):
        await asyncio.sleep(0.005)


def test_rejected_episodes_use_the_staleness_budget():
    """A rejected episode still fills its slot of a training batch (groups are handed out whole),
    so it must hold budget: otherwise every rejection lets one more group run ahead."""

    async def main():
        eng = VersionEngine()
        wf = EchoWorkflow()
        ex = make(wf, eng, max_head_offpolicyness=0, batch_size=1)
        ex.set_feeder(iter({"i": i, "fail": True} for i in range(50)))
        await _settle()
        assert wf.started == 2  # one group (the next step's batch) at version 0, not all 50
        (g0,) = await ex.wait_groups(1)
        assert not any(ep.accepted for ep in g0)
        await _settle()
        assert wf.started == 2  # the handed-out batch trains at version 0: nothing may start yet
        eng.version = 1
        ex.on_version_change()
        await _settle()
        assert wf.started == 4
        await ex.cancel_all()

    asyncio.run(main())


def test_staleness_bound_after_resuming_at_a_later_version():
    """An executor that starts at version 5 (Session.load, engine servers that served updates)
    must not count versions 0-4 as budget (AReaL's capacity inflation after recovery)."""

    async def main():
        eng = VersionEngine()
        eng.version = 5
        wf = EchoWorkflow()
        ex = make(wf, eng, max_head_offpolicyness=1, batch_size=1)
        ex.set_feeder(iter({"i": i} for i in range(50)))
        await _settle()
        assert wf.started == 4  # (S + 1) batches of one group of 2
        await ex.cancel_all()

    asyncio.run(main())


def test_versions_moved_by_small_explicit_batches_do_not_inflate_the_budget():
    """A notebook trains a few steps on rollout(1) of a 2-prompt batch size, then run()s with
    prefetch: the versions those steps moved consumed 2 episodes each, not a whole batch."""

    async def main():
        eng = VersionEngine()
        wf = EchoWorkflow()
        ex = make(wf, eng, max_head_offpolicyness=0, batch_size=2)  # B = 4 episodes
        for v in range(3):
            ex.submit({"i": v})
            await ex.wait_groups(1)
            eng.version = v + 1
            ex.on_version_change()
        started = wf.started
        ex.set_feeder(iter({"i": i} for i in range(10, 60)))
        await _settle()
        assert wf.started - started == 4  # one batch (2 groups), trained at version 3
        await ex.cancel_all()

    asyncio.run(main())


def test_trained_tokens_stay_within_the_bound_with_rejections_and_a_late_start():
    """End to end on the executor: steps hand out batches in order and move the version; every
    group's start version is within max_head_offpolicyness of the version that trains it."""

    async def main():
        for max_off in (0, 1, 2):
            eng = VersionEngine()
            eng.version = 7
            wf = EchoWorkflow(delay=0.002)
            ex = make(wf, eng, max_head_offpolicyness=max_off, batch_size=2)
            ex.set_feeder(iter({"i": i, "fail": i % 3 == 0, "slow": i % 2} for i in range(1000)))
            for _ in range(8):
                groups = await ex.wait_groups(2)
                lag = {eng.version - ep.version_submitted for g in groups for ep in g}
                assert max(lag) <= max_off, (max_off, lag)
                await asyncio.sleep(0.003)  # training
                eng.version += 1
                ex.on_version_change()
            await ex.cancel_all()

    asyncio.run(main())


def test_a_feeder_failing_as_an_episode_ends_reaches_the_caller():
    """The data iterator raising when a finished episode frees a slot (concurrency-bound async
    RL): the episode is still counted and its group handed out, and the error reaches the next
    wait_groups instead of dying in the episode's task."""

    def feeder():
        yield {"i": 0}
        raise RuntimeError("dataset file vanished")

    async def main():
        eng = VersionEngine()
        ex = make(EchoWorkflow(), eng, max_head_offpolicyness=1, batch_size=1, max_concurrent=2)
        ex.set_feeder(feeder())  # group 0 starts; the budget allows one more once a slot frees
        await _settle()
        assert ex.staleness.accepted == 2 and ex.staleness.running == 0
        with pytest.raises(RuntimeError, match="dataset file vanished"):
            await asyncio.wait_for(ex.wait_groups(1), 5)
        (g0,) = await asyncio.wait_for(ex.wait_groups(1), 5)  # nothing lost
        assert [ep.data["i"] for ep in g0] == [0, 0] and all(ep.accepted for ep in g0)

    asyncio.run(main())


def test_a_batch_handed_out_and_never_trained_gives_its_budget_back_at_the_next_version_step():
    """A notebook may look at a batch and drop it: once the version moves, it no longer counts
    (counting one batch per step kept it forever: with S = 0 nothing could start again)."""
    m = StalenessManager(max_concurrent=100, max_staleness=0, consumer_batch_size=4)
    for _ in range(2):  # two batches handed out at version 0; only the second is trained
        m.on_submit(4)
        for _ in range(4):
            m.on_finish(True)
        m.on_hand_out(4, version=0)
    assert m.capacity(0) == 4 - 8
    assert m.capacity(1) == 4


def test_prefetched_groups_past_the_bound_at_hand_out_are_generated_again():
    """Groups prefetched at version 0 and handed out only at version 3 (a notebook trained other
    batches meanwhile) would train tokens 3 versions old with S = 1: they are rolled out again
    at the current version, same rows, same order."""

    async def main():
        eng = VersionEngine()
        wf = EchoWorkflow()
        ex = make(wf, eng, max_head_offpolicyness=1, batch_size=1)
        ex.set_feeder(iter({"i": i} for i in range(100)))
        await asyncio.sleep(0.05)
        (g0,) = await ex.wait_groups(1)
        assert g0[0].data["i"] == 0 and g0[0].version_submitted == 0
        ex.set_feeder(None)  # run() ended; its prefetched group {"i": 1} waits, sampled at version 0
        eng.version = 3
        (g1,) = await ex.wait_groups(1)
        assert g1[0].data["i"] == 1
        assert {ep.version_submitted for ep in g1} == {3}
        assert all(ep.accepted for ep in g1) and ex.staleness.running == 0

    asyncio.run(main())


def test_waiting_for_more_groups_than_the_bound_lets_start_raises_instead_of_hanging():
    """S = 0 lets one batch (one group here) run ahead of training: asking the feeder for two
    without a training step between used to wait forever once the first had finished."""

    async def main():
        wf = EchoWorkflow()
        ex = make(wf, VersionEngine(), max_head_offpolicyness=0, batch_size=1)
        ex.set_feeder(iter({"i": i} for i in range(100)))
        with pytest.raises(StalenessLimitError, match="max_head_offpolicyness=0"):
            await asyncio.wait_for(ex.wait_groups(2), timeout=5)
        assert wf.started == 2  # one group of 2

    asyncio.run(main())

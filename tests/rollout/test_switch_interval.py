"""The GIL switch interval is lowered exactly while episodes run and always given back."""

import asyncio
import sys

import pytest

from areal_nb.rollout.executor import RolloutExecutor
from areal_nb.rollout.switch_interval import SwitchIntervalLease


@pytest.fixture(autouse=True)
def caller_interval():
    """Each test starts from a known caller value and leaves Python's default behind."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    yield 0.004
    sys.setswitchinterval(before)


def test_lease_sets_and_restores_the_callers_value(caller_interval):
    lease = SwitchIntervalLease(2e-4)
    lease.acquire()
    assert sys.getswitchinterval() == pytest.approx(2e-4)
    lease.acquire()  # held once: a second acquire changes nothing
    lease.release()
    assert sys.getswitchinterval() == caller_interval
    lease.release()  # not held: nothing happens
    assert sys.getswitchinterval() == caller_interval


def test_two_leases_restore_in_either_order(caller_interval):
    for first_out in (0, 1):
        a, b = SwitchIntervalLease(2e-4), SwitchIntervalLease(1e-4)
        a.acquire()
        b.acquire()
        assert sys.getswitchinterval() == pytest.approx(1e-4)  # the shortest asked for
        (a, b)[first_out].release()
        assert sys.getswitchinterval() == pytest.approx((2e-4, 1e-4)[1 - first_out])  # the other still holds
        (a, b)[1 - first_out].release()
        assert sys.getswitchinterval() == caller_interval


def test_a_value_set_by_someone_else_while_leased_is_kept(caller_interval):
    lease = SwitchIntervalLease(2e-4)
    with lease:
        sys.setswitchinterval(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.001)


def test_none_leaves_the_interval_alone_and_bad_values_are_refused(caller_interval):
    with SwitchIntervalLease(None):
        assert sys.getswitchinterval() == caller_interval
    for bad in (0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            SwitchIntervalLease(bad)


class RecordingWorkflow:
    """Records the switch interval each episode sees; data["fail"] raises, data["wait"] blocks."""

    def __init__(self):
        self.seen = []

    async def arun_episode(self, engine, data):
        self.seen.append(sys.getswitchinterval())
        await asyncio.sleep(0.01 * data.get("wait", 0))
        if data.get("fail"):
            raise RuntimeError("agent exploded")
        return {"call": data["i"]}


class Engine:
    def get_version(self):
        return 0


def make(workflow, interval=2e-4):
    return RolloutExecutor(
        workflow,
        Engine(),
        group_size=2,
        batch_size=2,
        max_head_offpolicyness=4,
        max_concurrent=8,
        switch_interval=interval,
    )


def test_executor_holds_the_interval_only_while_episodes_run_even_when_they_fail(caller_interval):
    async def main():
        wf = RecordingWorkflow()
        ex = make(wf)
        ex.submit({"i": 0})
        ex.submit({"i": 1, "fail": True, "wait": 2})
        assert sys.getswitchinterval() == pytest.approx(2e-4)
        groups = await ex.wait_groups(2)
        assert sys.getswitchinterval() == caller_interval  # the last episode (a failing one) gave it back
        assert [ep.accepted for g in groups for ep in g] == [True, True, False, False]
        assert wf.seen == [pytest.approx(2e-4)] * 4

    asyncio.run(main())


def test_cancelled_rollouts_and_two_executors_give_the_interval_back(caller_interval):
    async def main():
        training, evaluation = make(RecordingWorkflow()), make(RecordingWorkflow(), interval=1e-4)
        training.submit({"i": 0, "wait": 1000})
        evaluation.submit({"i": 1, "wait": 1})
        await asyncio.sleep(0)
        assert sys.getswitchinterval() == pytest.approx(1e-4)
        await evaluation.wait_groups(1)
        assert sys.getswitchinterval() == pytest.approx(2e-4)  # training still runs
        await training.cancel_all()  # Ctrl-C in a cell, or Session.close()
        assert sys.getswitchinterval() == caller_interval

    asyncio.run(main())


def test_executor_without_an_interval_leaves_it_alone(caller_interval):
    async def main():
        wf = RecordingWorkflow()
        ex = make(wf, interval=None)
        ex.submit({"i": 0})
        await ex.wait_groups(1)
        assert wf.seen == [caller_interval] * 2

    asyncio.run(main())

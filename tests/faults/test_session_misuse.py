"""A Session used wrongly says so, and every wait is bounded (the outcomes the Session's
docstring and docs/design.md §3 document):

- two threads calling at once: the second gets `SessionBusyError` naming both calls;
- a closed Session: every method raises `SessionClosedError`, `start()` included;
- an agent that ignores its cancellation: abandoned after the grace period, its episode rejected
  with that reason, and the step returns;
- `agent_timeout` times the agent's own run: a subproc agent answering in 0.3 s passes at
  `agent_timeout=2`, however long its worker processes take to start.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

from areal_nb import Session
from areal_nb.session.guard import SessionBusyError, SessionClosedError

from . import agents
from .conftest import small_config

ROWS = [{"messages": [{"role": "user", "content": f"say {i}"}]} for i in range(16)]


# ------------------------------------------------------------------------- a closed Session

# every public name of Session, and how to call it; a new method must be added here
CALLS = {
    "start": lambda s, tmp: s.start(),
    "rollout": lambda s, tmp: s.rollout(1),
    "arollout": lambda s, tmp: asyncio.run(s.arollout(1)),
    "train_step": lambda s, tmp: s.train_step(None),
    "atrain_step": lambda s, tmp: asyncio.run(s.atrain_step(None)),
    "step": lambda s, tmp: s.step(),
    "run": lambda s, tmp: s.run(1),
    "evaluate": lambda s, tmp: s.evaluate(1),
    "aevaluate": lambda s, tmp: asyncio.run(s.aevaluate(1)),
    "save": lambda s, tmp: s.save(tmp / "ckpt"),
    "save_pretrained": lambda s, tmp: s.save_pretrained(tmp / "hf"),
    "export": lambda s, tmp: s.export(tmp / "run"),
    "dashboard": lambda s, tmp: s.dashboard(),
    "proxy_caches": lambda s, tmp: s.proxy_caches(),
    "engine_log": lambda s, tmp: s.engine_log(),
    "add_step_callback": lambda s, tmp: s.add_step_callback(print),
    "proxy_url": lambda s, tmp: s.proxy_url,
    "admin_key": lambda s, tmp: s.admin_key,
    "app": lambda s, tmp: s.app,
    "__enter__": lambda s, tmp: s.__enter__(),
    "compare": lambda s, tmp: s.compare(None, {"grpo": {}}),
    "run_state": lambda s, tmp: s.run_state(),
}
# what stays usable: reading what the run produced, and closing again
READABLE = {
    "close",
    "load",
    "history",
    "rank",
    "world_size",
    "last_batch",
    "last_inspection",
    "config",
    "version",
    "step_count",
    # rank 0's parts, as they were (closed)
    "engine",
    "executor",
    "workflow",
    "data",
}


def public_names() -> set[str]:
    return {name for name, _ in inspect.getmembers(Session) if not name.startswith("_")} | {"__enter__"}


def test_every_public_name_is_either_refused_when_closed_or_readable():
    assert public_names() - READABLE == set(CALLS), "add the new Session method to CALLS or READABLE"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_method_of_a_closed_session_raises_the_same_error(name, tmp_path):
    s = Session(small_config(), start=False)
    s.close()
    with pytest.raises(SessionClosedError, match="this Session is closed"):
        CALLS[name](s, tmp_path)
    s.close()  # closing again is fine
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_start_after_close_raises_on_a_session_that_ran(tmp_path):
    s = Session(small_config(), dataset=ROWS, agent__workflow=agents.BlockedAgent, agent__workflow_kwargs={})
    agents.GO.set()
    s.rollout(1)
    s.close()
    for name in ("start", "rollout", "save", "proxy_url"):
        with pytest.raises(SessionClosedError):
            CALLS[name](s, tmp_path)
    assert s.history is not None  # what it produced stays readable


# ------------------------------------------------------------------------- two threads


@pytest.mark.slow
@pytest.mark.parametrize("second", ["step", "rollout", "evaluate", "save", "train_step"])
def test_a_call_from_a_second_thread_is_refused_naming_both(second, tmp_path):
    agents.GO.clear()
    with Session(
        small_config(),
        dataset=ROWS,
        eval_dataset=ROWS[:2],
        agent__workflow=agents.BlockedAgent,
        agent__workflow_kwargs={},
    ) as s:
        outcome = {}
        first = threading.Thread(target=lambda: outcome.setdefault("first", s.step()), name="first-caller")
        first.start()
        while s._calls._owner is None:  # the first thread is inside step(), held by the agent
            time.sleep(0.005)
        with pytest.raises(SessionBusyError) as info:
            CALLS[second](s, tmp_path)
        agents.GO.set()
        first.join(timeout=300)
        message = str(info.value)
        assert f"Session.{second}()" in message and "Session.step() runs in thread 'first-caller'" in message
        assert outcome["first"]["step"] == 1  # the first call was not disturbed
        assert s.step()["step"] == 2  # and the Session serves the next call


# ------------------------------------------------------------------------- bounded waits


@pytest.mark.slow
def test_an_agent_that_swallows_cancellation_is_abandoned_and_the_step_returns():
    with Session(
        small_config(agent__agent_timeout=1),
        dataset=ROWS,
        agent__workflow=agents.StubbornAgent(),
        agent__workflow_kwargs={},
    ) as s:
        row = s.step()
        batch = s.last_batch
        reasons = [ep.rejection_reason for ep in batch.episodes if not ep.accepted]
        assert row["step"] == 1 and batch.accepted and reasons, reasons
        assert all("agent_abandoned" in r and "ignored its cancellation" in r for r in reasons), reasons


@pytest.mark.slow
def test_agent_timeout_times_the_agent_not_its_worker_processes_start():
    cfg = small_config(agent__agent_timeout=2, agent__mode="subproc", agent__subproc_max_workers=2)
    with Session(
        cfg, dataset=ROWS, agent__workflow="tests.faults.agents.QuickSyncAgent", agent__workflow_kwargs={}
    ) as s:
        batch = s.rollout()
        assert [ep.rejection_reason for ep in batch.episodes] == [None] * len(batch.episodes)

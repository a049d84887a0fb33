"""Rollouts running ahead of training (`rollout.prefetch`) in a real Session: the staleness bound
after a resume, and checkpoints that lose no prefetched rows."""

from __future__ import annotations

import pytest

from areal_nb import Session

from .test_session import config

pytestmark = pytest.mark.slow


def waiting_rows(session: Session) -> tuple[list[dict], int]:
    """The rows of the groups fetched ahead and not trained on, and the data position: read on the
    session's loop, after the callbacks the last step scheduled there (they may start more)."""
    async def read():
        return [g.data for g in session.executor._groups], session.data.pos  # noqa: SLF001

    return session._runtime.call(read())  # noqa: SLF001


def test_checkpoint_keeps_the_prefetched_rows(tmp_path):
    """A checkpoint taken while groups fetched ahead wait untrained records the data position
    before them: the resumed run trains those prompts next instead of skipping them."""
    with Session(config(seed=5, rollout__prefetch=True, rollout__max_head_offpolicyness=1)) as a:
        a.run(1)  # handing step 1's batch out started step 2's (capacity allows one batch ahead)
        ahead, drawn = waiting_rows(a)
        assert len(ahead) >= a.config.rollout.batch_size
        ckpt = a.save(tmp_path / "ckpt")
    with Session.load(ckpt, rollout__prefetch=False) as b:
        assert b.data.pos == drawn - len(ahead) == a.config.rollout.batch_size  # one batch trained
        assert [episodes[0].data for episodes in b.rollout().groups.values()] == ahead[:2]


def test_staleness_bound_holds_after_resuming_with_prefetch(tmp_path):
    """A resumed run starts at version > 0 with nothing accepted yet: the budget must not count
    the earlier versions (AReaL's capacity inflation after recovery)."""
    with Session(config(seed=6)) as a:
        for _ in range(3):
            a.step()
        ckpt = a.save(tmp_path / "ckpt")
    with Session.load(ckpt, rollout__prefetch=True, rollout__max_head_offpolicyness=0) as b:
        assert b.version == 3
        b.run(3)
        assert b.history["staleness_max"].tolist()[3:] == [0.0, 0.0, 0.0]


def test_interrupting_a_run_gives_the_prefetched_rows_back():
    """Ctrl-C during run() cancels the groups fetched ahead; their rows are not skipped: the next
    rollout() draws them again (the clean-up the runtime runs on KeyboardInterrupt)."""
    with Session(config(seed=7, rollout__prefetch=True, rollout__max_head_offpolicyness=1)) as s:
        s.run(1)
        ahead, drawn = waiting_rows(s)
        assert ahead
        s._runtime.call(s._runtime.on_interrupt())  # noqa: SLF001 - what LoopRuntime.call runs on Ctrl-C
        assert s.executor.n_waiting == 0 and s.data.pos == drawn - len(ahead)
        assert [episodes[0].data for episodes in s.rollout().groups.values()] == ahead[:2]

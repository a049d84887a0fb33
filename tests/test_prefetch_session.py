"""Rollouts running ahead of training (`rollout.prefetch`) in a real Session: no prefetched row
lost to a checkpoint or an interrupt, the staleness bound after a resume, and the note run()
gives when stale tokens would train without the decoupled loss."""

from __future__ import annotations

import pytest

from areal_nb import Session
from areal_nb.config import SessionConfig
from areal_nb.session.session import uncorrected_staleness_note

from .test_session import config


def waiting_rows(session: Session) -> tuple[list[dict], int]:
    """The rows of the groups fetched ahead and not trained on, and the data position: read on the
    session's loop, after the callbacks the last step scheduled there (they may start more)."""

    async def read():
        return [g.data for g in session.executor._groups], session.data.pos  # noqa: SLF001

    return session._lead.runtime.call(read())  # noqa: SLF001


@pytest.mark.slow
def test_prefetched_rows_survive_checkpoints_and_interrupts_and_the_bound_holds_after_resuming(tmp_path):
    """Groups fetched ahead and not trained yet are not lost: a checkpoint records the data
    position before them, and Ctrl-C (the clean-up LoopRuntime runs) gives their rows back. A run
    resumed at version > 0 keeps the staleness bound (AReaL's capacity inflation after recovery)."""
    with Session(config(seed=5, rollout__prefetch=True, rollout__max_head_offpolicyness=1)) as a:
        a.run(1)  # handing step 1's batch out let the next batch start while it trained
        ahead, drawn = waiting_rows(a)
        assert len(ahead) >= a.config.rollout.batch_size
        ckpt = a.save(tmp_path / "ckpt")
        a._lead.runtime.call(a._lead.runtime.on_interrupt())  # noqa: SLF001 - what LoopRuntime.call runs on Ctrl-C
        assert a.executor.n_waiting == 0 and a.data.pos == drawn - len(ahead)
        assert [episodes[0].data for episodes in a.rollout().groups.values()] == ahead[:2]
    with Session.load(ckpt, rollout__prefetch=True, rollout__max_head_offpolicyness=0) as b:
        assert b.version == 1 and b.data.pos == drawn - len(ahead)
        batch = b.rollout()
        assert [episodes[0].data for episodes in batch.groups.values()] == ahead[:2]
        b.train_step(batch)
        b.run(3)
        assert b.history["staleness_max"].tolist()[-3:] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("overrides", "noted"),
    [
        ({}, True),  # the Session's defaults: prefetch on, 2 versions ahead, plain PPO
        ({"actor.use_decoupled_loss": True}, False),
        ({"rollout.prefetch": False}, False),
        ({"rollout.max_head_offpolicyness": 0}, False),
    ],
)
def test_run_notes_stale_tokens_trained_without_the_decoupled_loss(overrides, noted):
    cfg = SessionConfig.model_validate({})
    for key, value in overrides.items():
        section, field = key.split(".")
        setattr(getattr(cfg, section), field, value)
    note = uncorrected_staleness_note(cfg)
    assert (note is not None) == noted
    if noted:
        assert "actor.use_decoupled_loss=true" in note and "max_head_offpolicyness=2" in note

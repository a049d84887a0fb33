"""`Session.run(steps)`'s cadence: rollouts fetched ahead, evaluation and checkpoints on their
steps, the progress bar, and what every rank does per step.

Rank 0 (`lead`) steps the Session (rollout + train), background rollouts running ahead within the
staleness bound while `rollout.prefetch` is on, and every `logging.eval_every` steps adds
`evaluate()`'s figures to the step's history row; every `checkpoint.save_every` steps it saves to
`checkpoint.save_dir/step<N>`. Ranks ≠ 0 (`follow`) take one training step per step of rank 0's
and join its saves. Ctrl-C in the cell reaches the loop runtime (`runtime.py`), which cancels the
rollouts and re-raises here; the feeder is stopped on the way out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from areal_nb.config import SessionConfig
from areal_nb.rollout.learning_signal import progress_note

if TYPE_CHECKING:
    from .leader import Leader
    from .session import Session

logger = logging.getLogger(__name__)


def lead(session: Session, steps: int, *, show: bool, leader: Leader, still_open: Callable[[], bool]) -> None:
    """Rank 0: `steps` steps of `session`, after checking the first episode (and saying, once,
    `uncorrected_staleness_note`); `leader`: its parts (the loop, the executor, the data, the metrics)."""
    from tqdm.auto import tqdm

    cfg, runtime, executor = session.config, leader.runtime, leader.executor
    runtime.call(leader.check_first_episode())  # before background rollouts start
    note = uncorrected_staleness_note(cfg)
    if note is not None and not leader.staleness_noted:
        logger.warning(note)
        leader.staleness_noted = True
    if cfg.rollout.prefetch:
        runtime.call_soon(executor.set_feeder, leader.data)
    bar = tqdm(total=steps, desc=f"GRPO {cfg.experiment_name}", disable=not show)
    try:
        for _ in range(steps):
            row = session.step()
            if cfg.logging.eval_every and session.step_count % cfg.logging.eval_every == 0:
                figures = runtime.call(session.aevaluate()).as_dict()  # evaluate() on rank 0
                row.update(figures)  # the history row is this dict
                leader.log_metrics(session.step_count, figures)
            if (due := checkpoint_due(cfg, session.step_count)) is not None:
                session.save(due)
            bar.update(1)
            bar.set_postfix(
                reward=f"{row.get('reward_mean', float('nan')):.3f}",
                loss=f"{row.get('loss', 0):.4f}",
                **progress_note(row),  # most groups without signal: what to try
            )
    finally:
        bar.close()
        if cfg.rollout.prefetch and still_open():
            runtime.call_soon(executor.set_feeder, None)


def follow(session: Session, steps: int) -> None:
    """A rank ≠ 0: one training step per step of rank 0's (its batch), and its checkpoints."""
    for _ in range(steps):
        session.train_step(None)
        if (due := checkpoint_due(session.config, session.step_count)) is not None:
            session.save(due)


def checkpoint_due(cfg: SessionConfig, step: int) -> Path | None:
    """Where step `step`'s checkpoint goes, when `checkpoint.save_every` says one is due."""
    ckpt = cfg.checkpoint
    if ckpt.save_dir and ckpt.save_every and step % ckpt.save_every == 0:
        return Path(ckpt.save_dir) / f"step{step}"
    return None


def uncorrected_staleness_note(cfg: SessionConfig) -> str | None:
    """What run() says when its rollouts run ahead of training without the decoupled loss: those
    tokens, sampled up to `max_head_offpolicyness` versions ago, then train with plain PPO, whose
    ratio takes no account of the older policy that sampled them (with `recompute_logprob`, AReaL's
    default, it is taken against the current weights). On the demo config that lost 7.5 held-out
    points where the decoupled loss gained 23.5 (benchmarks/prefetch_learning.py, variant on_plain)."""
    rollout = cfg.rollout
    if not rollout.prefetch or rollout.max_head_offpolicyness == 0 or cfg.actor.use_decoupled_loss:
        return None
    return (
        f"run() generates rollouts up to rollout.max_head_offpolicyness={rollout.max_head_offpolicyness} "
        "versions ahead of training (rollout.prefetch), and actor.use_decoupled_loss is off: those tokens "
        "train with plain PPO, uncorrected for the older policy that sampled them (on the demo config this "
        "made held-out accuracy fall). Set actor.use_decoupled_loss=true (the behaviour-weighted loss), or "
        "rollout.prefetch=false / rollout.max_head_offpolicyness=0 to train on-policy"
    )

"""The figures a rollout batch and a training step put into `session.history`'s row.

A rollout's batch carries its own figures (`rollout_s`, `reward_mean` as the mean episode return,
tokens per second, each agent's mean return when there are several); a training step's row
joins them to the trainer's stats, the batch's learning signal (`learning_signal.py`) and the
version the engine serves afterwards. `StepHistory` keeps the rows and does what follows each
step: the learning-signal watch, the metrics sink, the step callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.learning_signal import signal_stats

from .diagnostics import SignalWatch
from .evaluation import EVAL_COLUMNS

logger = logging.getLogger(__name__)


class StepHistory:
    """One row of stats per training step (`history_row`), and what runs after each step."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.callbacks: list[Callable[[dict[str, Any]], None]] = []  # Session.add_step_callback
        self._signal_watch = SignalWatch()  # diagnostics.py: says when steps teach nothing

    def record(self, row: dict[str, Any], log_metrics: Callable[[int, dict[str, Any]], None] | None) -> None:
        """`row` joins the history; the metrics sink (rank 0's `log_metrics`) and the callbacks get it."""
        self.rows.append(row)
        self._signal_watch.observe(row, stacklevel=5)  # (the warning names the Session call's caller)
        if log_metrics is not None:
            log_metrics(row["step"], row)
        for fn in list(self.callbacks):
            try:
                fn(row)
            except Exception as e:  # a broken widget must not stop training
                logger.warning("step callback %r failed: %s", fn, e)

    def frame(self) -> Any:
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame.from_records(self.rows)


def add_rollout_stats(batch: RolloutBatch, elapsed: float) -> None:
    """`batch.stats` gets the rollout's figures (`elapsed`: seconds it took)."""
    accepted = [i for i, ep in enumerate(batch.episodes) if ep.accepted]
    out_tokens = sum(
        c.model_response.output_len for i in accepted for c in batch.calls(i) if c.model_response is not None
    )
    returns = [batch.episode_return(i) for i in accepted]
    batch.stats.update(
        {
            "rollout_s": elapsed,
            "episodes": len(batch.episodes),
            "rejected": len(batch.rejected),
            "reward_mean": sum(returns) / len(returns) if returns else float("nan"),
            "generated_tokens": out_tokens,
            "rollout_tokens_per_s": out_tokens / elapsed if elapsed > 0 else float("nan"),
        }
    )
    agent_means = batch.agent_reward_means()
    if len(agent_means) > 1:  # several agents: each one's mean return per episode, by name
        batch.stats.update({f"reward_mean/{agent}": mean for agent, mean in agent_means.items()})


def history_row(step: int, version: int, batch: RolloutBatch | None, stats: dict[str, Any]) -> dict[str, Any]:
    """Training step `step`'s row (`batch`: None on ranks ≠ 0, which hold no rollout figures)."""
    # the batch's figures, and whether it can teach anything (zero_signal_groups, ...: learning_signal.py)
    rollout_stats = {**batch.stats, **signal_stats(batch)} if batch is not None else {}
    row = {"step": step, **rollout_stats, **stats}
    if "reward_mean" in rollout_stats:
        # `reward_mean` is the mean episode return (as `evaluate()`'s); the trainer's mean over
        # its rows (one per call, discounted rewards) is kept beside it
        row["row_reward_mean"] = stats.get("reward_mean", float("nan"))
        row["reward_mean"] = rollout_stats["reward_mean"]
    row["version"] = version  # the version the engine serves after this step
    for key in EVAL_COLUMNS:  # filled in by run() on evaluation steps
        row.setdefault(key, float("nan"))
    return row

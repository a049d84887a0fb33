"""`logging` and `checkpoint`: where a run writes, what it reports, and its periodic checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import Section


class LoggingConfig(Section):
    """`logging`: where a run writes, and what it reports."""

    run_dir: str | None = None
    """Where the run writes logs, metrics and its final checkpoint; None: `runs/<experiment_name>`."""
    eval_every: int = Field(0, ge=0)
    """run() evaluates every this many steps (the history's eval_* columns); 0: only when asked."""
    progress: bool = True
    """run() shows a progress bar."""
    backend: Literal["none", "tensorboard", "wandb"] = "none"
    """Where per-step metrics go besides `session.history` and the dashboard."""


class CheckpointConfig(Section):
    """`checkpoint`: periodic checkpoints during run()."""

    save_dir: str | None = None
    """Where run() saves them (`<save_dir>/step<N>`); None: no periodic checkpoints."""
    save_every: int = Field(0, ge=0)
    """Steps between checkpoints; 0: none."""

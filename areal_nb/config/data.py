"""`data`: the task's rows, for training and for evaluation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from areal_nb.data import TaskConfig

from .section import Section


class DataConfig(Section):
    """`data`: the task's rows, for training and for evaluation."""

    source: Any = "generated"
    """"generated" (the built-in arithmetic task, `data.task`); a GSM8K-format JSONL file, a folder
    with train.jsonl/test.jsonl, or "openai/gsm8k"; or your own rows: a JSONL/JSON/Parquet/CSV/TSV
    path, or (from Python) a list of dicts, a pandas DataFrame or a `datasets.Dataset`. Rows reach
    the agent unchanged (areal_nb.data.load_rows)."""
    eval_source: Any = None
    """The held-out rows evaluate() runs on (same forms); None: the source's test split, or
    `eval_fraction` of a row source."""
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """The share of a row source held out for evaluation when there is no `eval_source`."""
    format: Literal["auto", "rows", "gsm8k"] = "auto"
    """How a .jsonl path is read: "auto" reads rows with "question"/"answer" and no "messages" as
    GSM8K (converted to chat prompts), any other file as rows; "rows" / "gsm8k" force one."""
    seed: int = 0
    """Seeds the generated problems, the training rows' shuffle (one per pass over the data) and the
    `eval_fraction` split. Left out of a session's config, it is the run's `seed`."""
    eval_size: int | None = Field(None, ge=1)
    """Held-out problems evaluate() runs on: None is 200 of the generated or GSM8K test split, and
    every row of your own held-out rows (a number cuts those too)."""
    task: TaskConfig = Field(default_factory=TaskConfig)
    """The generated task's knobs (`TaskConfig`), read with source "generated"."""

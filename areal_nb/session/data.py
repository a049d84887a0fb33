"""The Session's task data: an endless, seeded training stream and the held-out split.

`data.source` is one of three kinds:
- "generated": fresh GSM8K-format problems per chunk; the test split is a fixed held-out stream;
- a GSM8K source (file, folder, hub name): its train split streams, its test split is held out;
- the user's own rows (a list of dicts, DataFrame, datasets.Dataset, JSONL/JSON/Parquet/CSV/TSV path,
  or a "package.module:function" that returns them, e.g. the tool task's generated rows),
  passed to the agent unchanged; held out: `data.eval_source`, else `data.eval_fraction` of them.
Rows are checked when the Session starts (`areal_nb.data.check_rows`), so an empty dataset or a row
that is not a mapping fails there, not as rejected episodes later.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_nb.config import ConfigError, DataConfig
from areal_nb.data import (
    check_rows,
    generate_problems,
    is_row_factory,
    is_row_file,
    load_gsm8k_split,
    load_rows,
    split_rows,
)

DEFAULT_EVAL_SIZE = 200  # held-out problems of the generated or GSM8K test split when data.eval_size is None


@dataclass
class TaskData:
    """What `data.source` resolves to: the training rows (None: generated per chunk) and the held-out rows.

    `train_index[i]` is training row i's index in `data.source` (they differ after an
    `eval_fraction` split), so a failing row is named as the user's dataset numbers it."""

    train: list[dict] | None
    held_out: list[dict]
    train_index: list[int] | None = None


def load_task_data(cfg: DataConfig, *, picklable: bool = False) -> TaskData:
    """Load and check the configured data; `picklable` for agents in `subproc` mode."""
    train: list[dict] | None
    train_index = None
    if cfg.eval_fraction > 0 and cfg.eval_source is not None:
        raise ConfigError("give data.eval_source or data.eval_fraction, not both")
    row_source = not (
        isinstance(cfg.source, str) and (cfg.source == "generated" or _is_gsm8k(cfg.source, cfg.format))
    )
    own_held_out = (
        row_source  # the user's rows (or a split of them) are evaluated in full unless eval_size cuts them
    )
    if cfg.eval_fraction > 0 and not row_source:
        raise ConfigError(
            f"data.eval_fraction splits a dataset of rows; data.source {cfg.source!r} has its own test split"
        )
    if isinstance(cfg.source, str) and cfg.source == "generated":
        train, held_out = (
            None,
            generate_problems(cfg.eval_size or DEFAULT_EVAL_SIZE, seed=0, split="test", config=cfg.task),
        )
    elif _is_gsm8k(cfg.source, cfg.format):
        train = load_gsm8k_split(cfg.source, "train")
        if not train:
            raise ConfigError(f"data.source {cfg.source!r} holds no training problems")
        held_out = load_gsm8k_split(cfg.source, "test")
        if not held_out and cfg.eval_source is None:
            raise ConfigError(f"data.source {cfg.source!r} holds no test problems to evaluate on")
    else:
        train, held_out = load_rows(cfg.source, name="data.source"), []
        check_rows(train, name="data.source", picklable=picklable)
        train_index = list(range(len(train)))
        if cfg.eval_source is None and cfg.eval_fraction > 0:
            position = {id(row): i for i, row in enumerate(train)}
            train, held_out = split_rows(train, cfg.eval_fraction, seed=cfg.seed)
            train_index = [position[id(row)] for row in train]
    if cfg.eval_source is not None:
        own_held_out = not _is_gsm8k(cfg.eval_source, cfg.format)
        if not own_held_out:
            held_out = load_gsm8k_split(cfg.eval_source, "test")
        else:
            held_out = load_rows(cfg.eval_source, name="data.eval_source")
            check_rows(held_out, name="data.eval_source", picklable=picklable)
    eval_size = cfg.eval_size
    if eval_size is None and not own_held_out:
        eval_size = DEFAULT_EVAL_SIZE
    return TaskData(train=train, held_out=held_out[:eval_size], train_index=train_index)


def _is_gsm8k(source: Any, fmt: str) -> bool:
    """A string source read as GSM8K: a folder, a hub name, or (format "auto") a JSONL file whose
    first row has "question" and a GSM8K "answer" (reasoning, then "#### <value>") but no "messages".
    Any other JSONL is the user's rows: a task of its own may well name its fields question/answer."""
    if not isinstance(source, str) or fmt == "rows" or is_row_factory(source):
        return False
    if fmt == "gsm8k":
        return True
    if not is_row_file(source):  # a folder or a hub name; a file of another kind is refused by load_rows
        return not Path(source).expanduser().is_file()
    path = Path(source).expanduser()
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8-sig") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(row, dict)
        and "question" in row
        and "####" in str(row.get("answer", ""))
        and "messages" not in row
    )


class DataStream:
    """An endless, seeded stream of training rows whose position can be saved.

    Chunk k is 512 fresh generated problems, or the k-th seeded shuffle of the training rows.
    """

    def __init__(
        self, cfg: DataConfig, pos: int = 0, *, rows: list[dict] | None = None, index: list[int] | None = None
    ) -> None:
        self.cfg = cfg
        self.rows = rows
        self.index = index
        # by identity: the stream hands out the dataset's own row objects (the executor copies them)
        self._source_index = {id(row): (index[i] if index else i) for i, row in enumerate(rows or ())}
        self.pos = 0
        self._chunk = self._chunk_maker(cfg, rows)
        self._buffer: list[dict] = []
        self._chunk_index = 0
        for _ in range(pos):
            next(self)

    def at(self, pos: int) -> DataStream:
        """The same stream, positioned after `pos` rows (checkpoint restore)."""
        return DataStream(self.cfg, pos, rows=self.rows, index=self.index)

    def source_index(self, row: Any) -> int | None:
        """Where `row` (one this stream handed out) is in `data.source`; None for generated rows."""
        return self._source_index.get(id(row))

    def describe(self, row: Any) -> str | None:
        """`row` as a person finds it in their dataset: "data.source row 5"."""
        index = self.source_index(row)
        return None if index is None else f"data.source row {index}"

    def first_row(self) -> dict:
        """Row 0 of the dataset (of the first generated chunk), without moving the stream."""
        return self.rows[0] if self.rows else self._chunk(0)[0]

    @staticmethod
    def _chunk_maker(cfg: DataConfig, rows: list[dict] | None) -> Callable[[int], list[dict]]:
        if rows is None:
            return lambda k: generate_problems(
                512, seed=cfg.seed * 100_003 + k, split="train", config=cfg.task
            )

        def chunk(k: int) -> list[dict]:
            order = list(rows)
            random.Random(cfg.seed * 100_003 + k).shuffle(order)
            return order

        return chunk

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if not self._buffer:
            self._buffer = list(reversed(self._chunk(self._chunk_index)))
            self._chunk_index += 1
        self.pos += 1
        return self._buffer.pop()

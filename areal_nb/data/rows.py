"""A user's task data in any common form, as a list of rows (plain dicts) reaching the agent as is.

Accepted: a list (or other iterable) of mappings, a pandas DataFrame, a Hugging Face
`datasets.Dataset`, a path to a JSONL, JSON, Parquet, CSV or TSV file, or (so a YAML config can name
generated data) a `"package.module:function"` string, called with no arguments for the rows. Nothing is renamed:
the agent's `run(data)` gets each row as the source holds it. Tables (a DataFrame, CSV, TSV,
Parquet) give plain Python values, as a `datasets.Dataset` does: a missing cell (NaN, NaT, NA) is
None — a DataFrame made from rows with different keys fills the gaps with NaN, and a NaN where a
prompt or a message list should be is a float the agent cannot use — arrays (Parquet list columns)
are lists, NumPy scalars are ints, floats and bools. `check_rows` turns the mistakes that would otherwise
reject every episode (an empty dataset, a row that is not a mapping, a row a `subproc` agent
cannot receive) into one clear error before anything runs.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from areal_nb.errors import (
    DatasetError,  # noqa: F401 (re-exported)
    InvalidArgumentError,
)

_ROW_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv")
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_row_file(source: Any) -> bool:
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in _ROW_FILE_SUFFIXES


def is_row_factory(source: Any) -> bool:
    """`source` names a function that makes the rows: "package.module:function"."""
    return isinstance(source, str) and bool(_FACTORY_RE.match(source))


def _call_row_factory(source: str, *, name: str = "dataset") -> Any:
    """What the "package.module:function" `source` returns when called with no arguments."""
    module_name, attr = source.split(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise DatasetError(f"{name} {source!r}: cannot import it ({type(e).__name__}: {e})") from e
    if not callable(factory):
        raise DatasetError(
            f"{name} {source!r} is a {type(factory).__name__}, not a function that returns rows"
        )
    return factory()


def load_rows(source: Any, *, name: str = "dataset") -> list[dict]:
    """The rows of `source` (see the module doc) as a new list; `name` is used in errors."""
    if is_row_factory(source):
        return load_rows(_call_row_factory(source, name=name), name=name)
    if isinstance(source, (str, os.PathLike)):
        return read_row_file(source, name=name)
    module = type(source).__module__.split(".")[0]
    if module == "datasets" and isinstance(source, Mapping):  # a DatasetDict
        raise DatasetError(
            f"{name} is a DatasetDict with splits {list(source.keys())}; pass one split, "
            f"e.g. ds['train'] (and ds['test'] as the eval dataset)"
        )
    if isinstance(source, Mapping):
        raise DatasetError(f"{name} is a single mapping; pass a list of rows (dicts)")
    if module == "pandas" and hasattr(source, "columns"):
        return table_records(source)
    if module == "pandas":  # a Series (one column) or an Index: rows need their column names
        raise DatasetError(
            f"{name} is a pandas {type(source).__name__}; pass a DataFrame, e.g. "
            f"series.to_frame('prompt') or df[['prompt', 'target']]"
        )
    if module == "datasets" and hasattr(source, "to_list"):
        return source.to_list()
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes)):
        return list(source)
    raise DatasetError(
        f"{name} must be a list of dicts, a pandas DataFrame, a datasets.Dataset or a "
        f"path to a {'/'.join(_ROW_FILE_SUFFIXES)} file; got {type(source).__name__}"
    )


def read_row_file(path: str | os.PathLike, *, name: str = "dataset") -> list[dict]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"{name}: no such file {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
        if not isinstance(rows, list):
            raise DatasetError(
                f"{path}: a .json dataset must hold a list of rows (use .jsonl for one row per line)"
            )
        return rows
    import pandas as pd  # parquet needs pyarrow (or fastparquet) installed

    if suffix == ".parquet":
        return table_records(pd.read_parquet(path))
    if suffix in (".csv", ".tsv"):  # pandas reads the types ("5" is the number 5); empty cells are None
        return table_records(pd.read_csv(path, sep="," if suffix == ".csv" else "\t"))
    raise DatasetError(f"{name}: {str(path)!r} is not a {'/'.join(_ROW_FILE_SUFFIXES)} file")


def _read_jsonl(path: Path) -> list[dict]:
    return [row for _, row in jsonl_objects(path)]


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a .jsonl file; DatasetError naming the
    line for one that is not a JSON object."""
    with path.open(encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows editors) is not a row
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: a row must be a JSON object, got {type(row).__name__}")
            yield lineno, row


def table_records(frame: Any) -> list[dict]:
    """A DataFrame's rows with plain Python values (see the module doc)."""
    return [{key: _plain(value) for key, value in row.items()} for row in frame.to_dict(orient="records")]


def _plain(value: Any) -> Any:
    import numpy as np
    import pandas as pd

    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or value is pd.NaT or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def write_jsonl(rows: list[dict], path: str | os.PathLike, *, name: str = "dataset") -> Path:
    """`rows` as a JSONL file `read_row_file` reads back equal (rows must be JSON data)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, ensure_ascii=False, allow_nan=True))
        except (TypeError, ValueError) as e:
            raise DatasetError(
                f"{name} row {i} cannot be written as JSON ({e}); pass the dataset as a file "
                f"path (data.source) so the checkpoint can refer to it"
            ) from e
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def check_rows(rows: list, *, name: str = "dataset", picklable: bool = False) -> None:
    """Raise `DatasetError` for an empty dataset, a row that is not a mapping, or (with `picklable`,
    for agents in `subproc` mode, which receive each row pickled) a row pickle cannot send."""
    if not rows:
        raise DatasetError(f"{name} is empty: there is nothing to train or evaluate on")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DatasetError(
                f"{name} row {i} is a {type(row).__name__}, not a mapping: every row reaches the "
                f"agent as its `data` dict"
            )
        if picklable:
            try:
                pickle.dumps(row)
            except Exception as e:  # noqa: BLE001 - pickle raises several types
                raise DatasetError(
                    f"{name} row {i} cannot be pickled ({type(e).__name__}: {e}), so it cannot be "
                    f"sent to an agent in mode 'subproc'; use plain data or agent.mode 'inline'"
                ) from e


def split_rows(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded (train, held-out) split holding out `fraction` of the rows (at least one)."""
    if not 0 < fraction < 1:
        raise InvalidArgumentError(f"the held-out fraction must be in (0, 1), got {fraction}")
    if len(rows) < 2:
        raise DatasetError(f"{len(rows)} row(s) cannot be split into training and held-out rows")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_test = min(len(rows) - 1, max(1, round(fraction * len(rows))))
    held_out = set(order[:n_test])
    return (
        [r for i, r in enumerate(rows) if i not in held_out],
        [r for i, r in enumerate(rows) if i in held_out],
    )

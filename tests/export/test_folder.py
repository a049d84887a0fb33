"""The run folder travels: datasets given as Python rows or local files land inside it and
config.yaml points at them relative to the folder (train.py runs there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from areal_nb.config import load_config
from areal_nb.data import load_rows
from areal_nb.export import export_run

pytestmark = pytest.mark.server  # the export imports its result in a fresh interpreter

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": f"{i} + 1 =", "target": str(i + 1)} for i in range(5)]


def test_python_rows_and_local_files_are_written_into_the_folder(tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    config = load_config(ROOT / "configs" / "multi_turn_math.yaml",
                         {"data.source": ROWS, "data.eval_source": str(held_out)})
    run = export_run(tmp_path / "run", config)

    exported = load_config(run / "config.yaml")
    assert (exported.data.source, exported.data.eval_source, exported.data.format) == \
        ("data/train.jsonl", "data/eval.jsonl", "rows")
    cwd = os.getcwd()
    os.chdir(run)  # as train.py does
    try:
        assert load_rows(exported.data.source) == ROWS and load_rows(exported.data.eval_source) == ROWS[:2]
    finally:
        os.chdir(cwd)
    assert config.data.source is ROWS  # the notebook's config is left as it was

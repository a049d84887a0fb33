"""The run folder travels: datasets given as Python rows or local files land inside it and
config.yaml points at them relative to the folder (train.py runs there)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from areal_nb.config import load_config
from areal_nb.data import load_rows
from areal_nb.export import ExportError, export_run

pytestmark = pytest.mark.server  # the export imports its result in a fresh interpreter

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": f"{i} + 1 =", "target": str(i + 1)} for i in range(5)]


def test_python_rows_and_local_files_are_written_into_the_folder(tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    config = load_config(
        ROOT / "configs" / "multi_turn_math.yaml", {"data.source": ROWS, "data.eval_source": str(held_out)}
    )
    run = export_run(tmp_path / "run", config)

    exported = load_config(run / "config.yaml")
    assert (exported.data.source, exported.data.eval_source, exported.data.format) == (
        "data/train.jsonl",
        "data/eval.jsonl",
        "rows",
    )
    cwd = os.getcwd()
    os.chdir(run)  # as train.py does
    try:
        assert load_rows(exported.data.source) == ROWS and load_rows(exported.data.eval_source) == ROWS[:2]
    finally:
        os.chdir(cwd)
    assert config.data.source is ROWS  # the notebook's config is left as it was


def test_a_reward_and_a_row_factory_named_by_import_path_travel_with_their_modules(tmp_path, monkeypatch):
    """`reward_fn="my_rewards:exact"` and `data.source="my_rows:make"` name the user's own
    modules (beside the notebook, not installed): the folder gets copies, checked to import."""
    home = tmp_path / "notebook"
    home.mkdir()
    (home / "my_rewards.py").write_text(
        "def exact(row, reply):\n    return float(reply.strip() == row['target'])\n"
    )
    (home / "my_rows.py").write_text(f"def make():\n    return {ROWS!r}\n")
    monkeypatch.chdir(home)
    monkeypatch.syspath_prepend(str(home))
    config = load_config(
        ROOT / "configs" / "multi_turn_math.yaml",
        {
            "agent.workflow": "areal_nb.agents.chat_agent.ChatAgent",
            "agent.workflow_kwargs": {"reward_fn": "my_rewards:exact"},
            "agent.chat_template_type": "hf",
            "agent.export_style": "individual",
            "data.source": "my_rows:make",
        },
    )
    run = export_run(tmp_path / "run", config)
    assert (run / "my_rewards.py").read_text() == (home / "my_rewards.py").read_text()
    assert (run / "my_rows.py").read_text() == (home / "my_rows.py").read_text()
    exported = load_config(run / "config.yaml")
    assert (
        exported.agent.workflow_kwargs == {"reward_fn": "my_rewards:exact"}
        and exported.data.source == "my_rows:make"
    )


def test_a_file_name_in_agent_kwargs_beside_a_same_named_module_is_not_an_import_path(tmp_path, monkeypatch):
    """`workflow_kwargs={"notes": "notes.txt"}` beside a `notes.py` reads like the import path
    `notes.txt`; it names no object, so it stays text (the export used to fail importing it)."""
    home = tmp_path / "notebook"
    home.mkdir()
    (home / "notes.py").write_text("HELPER = 1\n")
    (home / "my_agent.py").write_text(
        "class Agent:\n    def __init__(self, notes='none'):\n        self.notes = notes\n"
        "    async def run(self, data, **kw):\n        return 1.0\n"
    )
    monkeypatch.chdir(home)
    monkeypatch.syspath_prepend(str(home))
    for name in ("notes", "my_agent"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    config = load_config(
        ROOT / "configs" / "multi_turn_math.yaml",
        {"agent.workflow": "my_agent.Agent", "agent.workflow_kwargs": {"notes": "notes.txt"}},
    )
    run = export_run(tmp_path / "run", config)
    assert (run / "my_agent.py").exists() and not (run / "notes.py").exists()
    assert load_config(run / "config.yaml").agent.workflow_kwargs == {"notes": "notes.txt"}


def test_an_exported_runs_agent_py_travels_when_that_run_is_exported_again(tmp_path, monkeypatch):
    """A job's Session (train.py puts its folder on sys.path; agent.workflow is "agent.Agent")
    exported again: the new folder carries agent.py too."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "agent.py").write_text(
        "class Agent:\n    async def run(self, data, **kw):\n        return 1.0\n"
    )
    monkeypatch.chdir(first)
    monkeypatch.syspath_prepend(str(first))
    monkeypatch.delitem(sys.modules, "agent", raising=False)
    config = load_config(ROOT / "configs" / "multi_turn_math.yaml", {"agent.workflow": "agent.Agent"})
    run = export_run(tmp_path / "second", config)
    assert (run / "agent.py").read_text() == (first / "agent.py").read_text()


@pytest.mark.parametrize("source", ["missing/train.jsonl", Path("missing.csv")])
def test_a_data_file_that_is_not_there_fails_at_export_naming_it(tmp_path, source):
    config = load_config(ROOT / "configs" / "multi_turn_math.yaml", {"data.eval_source": source})
    with pytest.raises(ExportError, match=r"data.eval_source .*missing.* is not a file"):
        export_run(tmp_path / "run", config)
    assert list(tmp_path.iterdir()) == []


def test_a_user_module_named_like_the_folders_own_files_is_refused(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(
        "class Agent:\n    async def run(self, data, **kw):\n        return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "train", raising=False)
    config = load_config(ROOT / "configs" / "multi_turn_math.yaml", {"agent.workflow": "train.Agent"})
    with pytest.raises(ExportError, match=r"your module .*train.py.*rename the module"):
        export_run(tmp_path / "run", config)
    assert not (tmp_path / "run").exists()


def test_an_export_through_a_link_to_a_folder_writes_into_the_folder(tmp_path):
    """`runs` linked to a scratch filesystem, as clusters often do: the export (and a re-export)
    lands in the linked folder, and the link stays a link."""
    target = tmp_path / "scratch" / "run"
    target.mkdir(parents=True)
    link = tmp_path / "run"
    link.symlink_to(target, target_is_directory=True)
    config = load_config(ROOT / "configs" / "multi_turn_math.yaml")
    export_run(link, config)
    export_run(link, load_config(config, {"total_steps": 3}), overwrite=True)
    assert link.is_symlink() and load_config(target / "config.yaml").total_steps == 3

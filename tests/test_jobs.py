"""`areal-nb train` and `areal-nb demo` end to end on the tiny model, shortened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml")
SHORT = [
    "total_steps=2",
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "data.eval_size=4",
    "logging.progress=false",
]


def test_train_job_writes_history_eval_and_checkpoint_under_the_experiment(tmp_path, monkeypatch, capsys):
    from areal_nb.train_job import main

    monkeypatch.chdir(tmp_path)
    assert main(["--config", CONFIG, *SHORT, "experiment_name=short-run", "logging.eval_every=1"]) == 0
    run_dir = tmp_path / "runs" / "short-run"  # the default run dir names the experiment
    history = (run_dir / "history.csv").read_text().splitlines()
    assert len(history) == 3 and "eval_reward" in history[0] and "eval_agent_accuracy" in history[0]
    figures = json.loads((run_dir / "final_eval.json").read_text())
    assert figures["experiment_name"] == "short-run" and figures["n"] == 4
    assert 0.0 <= figures["eval_accuracy"] <= figures["eval_agent_accuracy"] <= 1.0
    assert (run_dir / "final" / "state.pt").is_file()
    assert "done: short-run, 2 steps" in capsys.readouterr().out


def test_demo_summary_keeps_its_keys(tmp_path):
    from areal_nb.demo import main

    assert main(["--config", CONFIG, "--out", str(tmp_path), *SHORT]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "accuracy_before",
        "accuracy_after",
        "agent_accuracy_before",
        "agent_accuracy_after",
        "eval_reward_before",
        "eval_reward_after",
        "reward_per_step",
        "wall_s",
    ):
        assert key in summary, key
    assert summary["accuracy_before"] <= summary["agent_accuracy_before"]
    assert summary["eval_problems"] == 4 and summary["steps"] == 2
    assert (tmp_path / "reward_curve.png").stat().st_size > 0

"""The credit experiment's bookkeeping (benchmarks/credit_experiment.py): conditions, means over
seeds and the markdown table, on hand-made run records (the runs themselves are not made here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_experiment.py"


@pytest.fixture(scope="module")
def experiment():
    spec = importlib.util.spec_from_file_location("credit_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(credit, gamma, seed, before, after, rewards):
    return {
        "credit": credit,
        "discount": gamma,
        "seed": seed,
        "before": before,
        "after": after,
        "reward_per_step": rewards,
    }


def test_leaf_runs_once_unless_asked(experiment):
    assert experiment.conditions(["leaf", "turn"], [0.9, 0.5], False) == [
        ("leaf", 0.9),
        ("turn", 0.9),
        ("turn", 0.5),
    ]
    assert experiment.conditions(["leaf"], [0.9, 0.5], True) == [("leaf", 0.9), ("leaf", 0.5)]


def test_summary_means_over_seeds_and_the_table(experiment):
    runs = [
        run(
            "turn",
            0.9,
            1,
            {"first_reply": 0.5, "within_turns": 0.6},
            {"first_reply": 0.7, "within_turns": 0.8},
            [0.5, 0.6, 0.7],
        ),
        run(
            "turn",
            0.9,
            2,
            {"first_reply": 0.5, "within_turns": 0.6},
            {"first_reply": 0.9, "within_turns": 0.8},
            [0.3, 0.4, 0.5],
        ),
    ]
    (row,) = experiment.summarise(runs)
    assert row["seeds"] == [1, 2]
    assert row["first_reply_after"] == pytest.approx((0.8, 0.1414213562), abs=1e-9)  # mean, sample std
    assert row["first_reply_gain"] == pytest.approx((0.3, 0.1414213562), abs=1e-9)
    assert row["within_turns_gain"] == pytest.approx((0.2, 0.0), abs=1e-12)
    assert row["reward_curve_mean"] == pytest.approx([0.4, 0.5, 0.6])
    assert row["reward_first5"] == pytest.approx((0.5, 0.1414213562), abs=1e-9)  # 3 steps: k = 3
    table = experiment.markdown_table([row], 2)
    assert table.splitlines()[0].startswith("| credit | γ | seeds | first reply before → after |")
    assert table.splitlines()[2] == (
        "| turn | 0.9 | 2 | 0.500 ± 0.000 → 0.800 ± 0.141 | +0.300 ± 0.141 | "
        "0.600 ± 0.000 → 0.800 ± 0.000 | +0.200 ± 0.000 | 0.500 ± 0.141 → 0.500 ± 0.141 |"
    )

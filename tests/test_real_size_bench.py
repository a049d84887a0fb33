"""benchmarks/real_size.py hands TRL the problems the Session trains on, step by step.

TRL gets `training_problems` (in order, unshuffled, one step per `prompts` of them); the Session
draws its own from its data stream. The comparison means something only if each of our steps
sees exactly the prompts of the matching slice: here one Session step on tiny-math checks it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.slow


def test_our_steps_see_the_problems_trl_is_given() -> None:
    from grpo_vs_trl import GrpoSetup, prompts_digest, run_ours, session_config, training_problems

    from areal_nb.session.data import load_task_data

    setup = GrpoSetup(prompts=3, group=2, max_new_tokens=4, lr=1e-5, lr_schedule="constant", clip=0.2)
    problems = training_problems(2, setup)
    assert len(problems) == 6
    held_out = load_task_data(session_config(2, setup).data).held_out[:2]

    result = run_ours(2, held_out, setup)

    slices = [problems[i * 3 : (i + 1) * 3] for i in range(2)]
    expected = [prompts_digest([p["messages"][-1]["content"] for p in chunk]) for chunk in slices]
    assert [step["prompts"] for step in result["per_step"]] == expected
    assert expected[0] != expected[1]
    assert 0.0 <= result["acc_before"] <= 1.0 and 0.0 <= result["acc_after"] <= 1.0
    assert all(step["peak_rss_gib"] >= step["rss_gib"] > 0 for step in result["per_step"])

"""Generated GSM8K-format problems: shape, determinism, the fixed held-out split, knobs."""

from __future__ import annotations

import re

import pytest

from areal_nb.data import (
    CORRECTION_PROMPT,
    TaskConfig,
    generate_problems,
    reference_reply,
    reply_for,
    score_answer,
    split_of,
)
from areal_nb.errors import ConfigError, InvalidArgumentError


def _evaluate(answer: str) -> int:
    """Recompute the final value from the worked solution lines."""
    total = None
    for line in answer.split("####")[0].strip().splitlines():
        lhs, rhs = line.split("=")
        assert eval(lhs) == int(rhs), line  # the arithmetic in the solution is right
        if total is not None:
            assert lhs.startswith(str(total))  # each step continues from the previous result
        total = int(rhs)
    return total


def test_problem_shape_and_consistent_answers():
    for p in generate_problems(300, seed=3):
        assert set(p) == {"question", "answer", "answer_value", "messages"}
        assert p["messages"] == [{"role": "user", "content": p["question"]}]
        assert p["answer"].endswith(f"\n#### {p['answer_value']}")
        assert _evaluate(p["answer"]) == int(p["answer_value"])
        numbers = [int(x) for x in re.findall(r"\d+", p["question"])]
        assert len(numbers) == 2 and all(0 <= x <= 9 for x in numbers)


def test_first_problem_of_seed_zero_is_stable():
    p = generate_problems(1, seed=0)[0]
    assert p["question"] == ("A bag holds 6 oranges. Liam takes 2 out. How many oranges are in the bag now?")
    assert p["answer"] == "6-2=4\n#### 4"
    assert p["answer_value"] == "4"
    assert reference_reply(p) == "\\boxed{4}"


def test_same_seed_same_problems_other_seed_other_problems():
    assert generate_problems(50, seed=7) == generate_problems(50, seed=7)
    assert generate_problems(50, seed=7) != generate_problems(50, seed=8)
    assert generate_problems(20, seed=7) == generate_problems(50, seed=7)[:20]


def test_test_split_is_fixed_distinct_and_disjoint_from_train():
    test = generate_problems(200, split="test")
    assert test == generate_problems(200, seed=123, split="test")
    assert generate_problems(50, seed=5, split="test") == test[:50]
    test_questions = {p["question"] for p in test}
    assert len(test_questions) == 200
    assert all(split_of(q) == "test" for q in test_questions)
    for seed in range(3):
        train = generate_problems(2000, seed=seed, split="train")
        assert not test_questions & {p["question"] for p in train}
        assert all(split_of(p["question"]) == "train" for p in train)


def test_knobs_number_range_operations_and_steps():
    cfg = TaskConfig(min_operand=2, max_operand=5, operations=("*",), min_steps=2, max_steps=3)
    for p in generate_problems(100, seed=1, config=cfg):
        lines = p["answer"].split("####")[0].strip().splitlines()
        assert 2 <= len(lines) <= 3
        assert all("*" in line for line in lines)
        numbers = [int(x) for x in re.findall(r"\d+", p["question"])]
        assert all(2 <= x <= 5 for x in numbers)
        assert _evaluate(p["answer"]) == int(p["answer_value"])


def test_subtraction_never_goes_negative():
    cfg = TaskConfig(operations=("-",), max_steps=3)
    for p in generate_problems(200, seed=2, config=cfg):
        assert int(p["answer_value"]) >= 0
        _evaluate(p["answer"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"operations": ("/",)}, "unknown operation"),
        ({"operations": ()}, "at least one"),
        ({"min_operand": 5, "max_operand": 4}, "operand range"),
        ({"min_steps": 0}, "steps range"),
        ({"test_fraction": 1.0}, "test_fraction"),
    ],
)
def test_bad_task_config_is_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):  # a ValueError, as before
        TaskConfig(**kwargs)


def test_bad_arguments_and_too_small_question_space():
    with pytest.raises(InvalidArgumentError, match="split"):
        generate_problems(1, split="validation")
    with pytest.raises(InvalidArgumentError, match="n must be"):
        generate_problems(-1)
    # 5-5=0, and then nothing is left to subtract 5 from: every draw is a dead end.
    dead_end = TaskConfig(min_operand=5, max_operand=5, operations=("-",), min_steps=2, max_steps=2)
    with pytest.raises(ConfigError, match="could only generate 0 of 1"):
        generate_problems(1, config=dead_end)


def test_reference_and_wrong_replies_score_as_expected():
    for p in generate_problems(30, seed=4, config=TaskConfig(max_steps=2)):
        assert score_answer(reference_reply(p), p["answer_value"]) == 1.0
        wrong = int(p["answer_value"]) + 1
        assert score_answer(reply_for(p, wrong), p["answer_value"]) == 0.0
    assert CORRECTION_PROMPT.startswith("Your answer is either wrong or not parsable")

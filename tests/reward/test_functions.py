"""Reward functions: callables or import paths, sync or async, and a clear error for bad returns."""

from __future__ import annotations

import asyncio

import pytest

from areal_nb.reward import RewardValueError, compute_reward, resolve_reward
from areal_nb.reward.functions import math_answer

ROW = {"prompt": "What is 2 + 3?", "target": "5", "answer": "2+3=5\n#### 5"}


def contains_target(row, completion):
    return float(row["target"] in completion)


async def async_contains_target(row, completion):
    await asyncio.sleep(0)
    return float(row["target"] in completion)


class CallableReward:
    async def __call__(self, row, completion):
        return 0.5


def test_sync_and_async_functions_and_callables_score_the_row():
    assert asyncio.run(compute_reward(contains_target, ROW, "it is 5")) == 1.0
    assert asyncio.run(compute_reward(async_contains_target, ROW, "it is 4")) == 0.0
    assert asyncio.run(compute_reward(CallableReward(), ROW, "")) == 0.5
    assert asyncio.run(compute_reward(lambda row, c: 1, ROW, "")) == 1.0  # an int is a number


@pytest.mark.parametrize("value", [None, True, "1", float("nan"), float("inf")])
def test_a_reward_that_is_not_a_finite_number_is_an_error(value):
    with pytest.raises(RewardValueError, match="expected a finite number"):
        asyncio.run(compute_reward(lambda row, c: value, ROW, ""))


def test_exceptions_of_the_reward_function_propagate_unchanged():
    with pytest.raises(KeyError, match="missing"):
        asyncio.run(compute_reward(lambda row, c: row["missing"], ROW, ""))


def test_import_paths_resolve_in_both_spellings():
    assert resolve_reward("areal_nb.reward.functions.math_answer") is math_answer
    assert resolve_reward("areal_nb.reward.functions:math_answer") is math_answer
    assert resolve_reward(contains_target) is contains_target


def test_bad_import_paths_say_what_is_missing():
    with pytest.raises(ImportError, match="cannot import module 'no_such_pkg'"):
        resolve_reward("no_such_pkg.reward")
    with pytest.raises(ImportError, match="has no attribute 'nope'"):
        resolve_reward("areal_nb.reward.functions.nope")
    with pytest.raises(TypeError, match="not a function"):
        resolve_reward("areal_nb.reward.functions.__doc__")  # a str attribute
    with pytest.raises(ValueError, match="not an import path"):
        resolve_reward("exact_match")
    with pytest.raises(TypeError, match="callable or an import path"):
        resolve_reward(3)


def test_math_verify_stays_a_built_in_row_reward():
    assert math_answer(ROW, "The answer is 5") == 1.0
    assert math_answer(ROW, "The answer is 6") == 0.0

"""Reward functions: callables or import paths, sync or async, and a clear error for bad returns."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest
import torch

from areal_nb.agents.chat_agent import ChatAgent
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


@pytest.mark.parametrize("value", [None, "1", float("nan"), float("inf"), [1.0], np.array([1.0, 0.0]), 1j])
def test_a_reward_that_is_not_a_finite_number_is_an_error(value):
    with pytest.raises(RewardValueError, match="expected a finite number"):
        asyncio.run(compute_reward(lambda row, c: value, ROW, ""))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, 1.0),
        (False, 0.0),
        (np.bool_(True), 1.0),
        (np.float32(0.5), 0.5),
        (np.int64(2), 2.0),
        (np.array(0.25), 0.25),
        (np.array([0.75]), 0.75),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([True]), 1.0),
        (Fraction(1, 4), 0.25),
        (-3, -3.0),
    ],
)
def test_bools_and_numpy_or_torch_scalars_are_rewards(value, expected):
    # `return reply == row["target"]` or `np.mean(...)` / `torch.tensor(...)` results are what
    # people write; they are read as plain floats
    result = asyncio.run(compute_reward(lambda row, c: value, ROW, ""))
    assert result == expected and type(result) is float


async def async_bool_reward(row, completion):
    return row["target"] in completion


def test_an_async_reward_returning_a_bool_is_read_as_one_or_zero():
    assert asyncio.run(compute_reward(async_bool_reward, ROW, "it is 5")) == 1.0
    assert asyncio.run(compute_reward(async_bool_reward, ROW, "it is 4")) == 0.0


def trl_style(completions, **kwargs):
    return [1.0 for _ in completions]


def areal_style(prompt, completions, prompt_ids, completion_ids, answer, **kwargs):
    return 1.0


@pytest.mark.parametrize("fn", [trl_style, areal_style, lambda completion: 1.0])
def test_a_reward_that_cannot_take_row_and_completion_is_refused_when_given(fn):
    with pytest.raises(TypeError, match=r"cannot be called as fn\(row, completion\)"):
        resolve_reward(fn)
    with pytest.raises(TypeError, match=r"cannot be called as fn\(row, completion\)"):
        ChatAgent(reward_fn=fn)


def test_rewards_with_defaults_varargs_or_no_signature_are_accepted():
    def with_defaults(row, completion, scale=1.0):
        return scale

    assert resolve_reward(with_defaults) is with_defaults
    assert resolve_reward(lambda *args: 1.0) is not None
    assert resolve_reward(max) is max  # a builtin: nothing to check, called as is
    assert resolve_reward(CallableReward()) is not None


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

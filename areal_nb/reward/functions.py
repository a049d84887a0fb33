"""Rewards as plain functions: `reward_fn(row, completion) -> float`, sync or async.

`row` is the dataset row the episode ran on (the agent's `data`), `completion` what the agent
scores — for the built-in `ChatAgent` the reply text. A YAML config names a function by its
import path (`"my_pkg.rewards.exact_match"` or `"my_pkg.rewards:exact_match"`). A sync function
runs in a worker thread so a slow one does not stall the event loop the episodes share; a
CPU-heavy or untrusted one belongs in `AsyncRewardWrapper` (separate processes, timeouts).

What a reward may return: any real number (int, float, a NumPy scalar, a one-element array or
tensor) or a bool, read as 1.0 / 0.0 (`return reply.strip() == row["answer"]` is a reward).
None, NaN, infinities and anything else raise `RewardValueError`: the episode is rejected with
that message rather than trained on a made-up value.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from areal_nb.api.import_path import import_named_object
from areal_nb.errors import (
    ArgumentTypeError,
    RewardValueError,  # noqa: F401 (re-exported)
)

RewardFn = Callable[[Mapping[str, Any], Any], "float | Awaitable[float]"]


def resolve_reward(fn: RewardFn | str) -> RewardFn:
    """`fn` itself, or the function an import path (`pkg.mod.func` / `pkg.mod:func`) names."""
    if callable(fn):
        _check_reward_signature(fn)
        return fn
    if not isinstance(fn, str) or not fn.strip():
        raise ArgumentTypeError(
            f"a reward must be a callable or an import path string, got {type(fn).__name__}"
        )
    target = import_named_object(
        fn,
        not_a_path=f"reward {fn!r} is not an import path like 'my_pkg.rewards.exact_match'",
        import_error=ImportError,
        cannot_import=f"reward {fn!r}",
    )
    if not callable(target):
        raise ArgumentTypeError(f"reward {fn!r} is a {type(target).__name__}, not a function")
    _check_reward_signature(target)
    return target


def _check_reward_signature(fn: Callable[..., Any]) -> None:
    """Raise TypeError now, not at the first episode, when `fn` cannot be called as `fn(row, completion)`
    (e.g. a TRL-style `fn(completions, **kwargs)` or AReaL's `fn(prompt, completions, ...)`)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none to read
        return
    try:
        signature.bind(None, None)
    except TypeError as e:
        raise ArgumentTypeError(
            f"reward function {_name(fn)}{signature} cannot be called as fn(row, completion) ({e}); "
            f"a reward takes the dataset row and the completion"
        ) from None


async def compute_reward(fn: RewardFn, row: Mapping[str, Any], completion: Any) -> float:
    """`fn(row, completion)` as a float; exceptions from `fn` propagate unchanged."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):  # noqa: B004 (an instance with async __call__)
        value: Any = await cast(Awaitable[float], fn(row, completion))  # a coroutine function, checked above
    else:
        value = await asyncio.to_thread(fn, row, completion)
        if inspect.isawaitable(value):
            value = await value
    number = _as_reward_number(value)
    if number is None:
        raise RewardValueError(
            f"reward function {_name(fn)!r} returned {value!r:.200}; expected a finite number (or a bool)"
        )
    return number


def _as_reward_number(value: Any) -> float | None:
    """`value` as a finite float when it is a real number, a bool or a one-element array/tensor; else None."""
    if hasattr(value, "item") and getattr(value, "shape", None) in ((), (1,), [1]):  # NumPy / torch scalars
        value = value.item()
    if not isinstance(value, (numbers.Real, bool)) and type(value).__name__ != "bool_":
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def math_answer(row: Mapping[str, Any], completion: Any) -> float:
    """The built-in math reward as a row function: math-verify `completion` against `row["answer"]`
    (`reward_fn: areal_nb.reward.functions.math_answer`)."""
    from .gsm8k import math_reward

    return math_reward(str(completion), row["answer"])

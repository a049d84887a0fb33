"""Rewards: plain reward functions (`functions.py`), running them in worker processes, math checking,
an LLM judge (`judge_llm.py`: `judge(rubric, ...)`)."""

from .async_wrapper import (
    AsyncRewardWrapper,
    RewardError,
    RewardFunctionError,
    RewardTimeoutError,
    RewardWorkerCrashedError,
    default_max_workers,
)
from .functions import RewardFn, RewardValueError, compute_reward, resolve_reward
from .gsm8k import gsm8k_reward_fn, math_reward
from .judge_llm import Judge, JudgeError, judge

__all__ = [
    "AsyncRewardWrapper",
    "Judge",
    "JudgeError",
    "RewardError",
    "RewardFn",
    "RewardFunctionError",
    "RewardTimeoutError",
    "RewardValueError",
    "RewardWorkerCrashedError",
    "compute_reward",
    "default_max_workers",
    "gsm8k_reward_fn",
    "judge",
    "math_reward",
    "resolve_reward",
]

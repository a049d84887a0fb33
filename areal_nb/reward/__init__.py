"""Rewards: plain reward functions (`functions.py`), running them in worker processes, math checking."""

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

__all__ = [
    "AsyncRewardWrapper",
    "RewardError",
    "RewardFn",
    "RewardFunctionError",
    "RewardTimeoutError",
    "RewardValueError",
    "RewardWorkerCrashedError",
    "compute_reward",
    "default_max_workers",
    "gsm8k_reward_fn",
    "math_reward",
    "resolve_reward",
]

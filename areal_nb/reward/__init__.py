"""Rewards: run reward functions off the event loop, and math answer checking."""

from .async_wrapper import (
    AsyncRewardWrapper,
    RewardError,
    RewardFunctionError,
    RewardTimeoutError,
    RewardWorkerCrashedError,
    default_max_workers,
)
from .gsm8k import gsm8k_reward_fn, math_reward

__all__ = [
    "AsyncRewardWrapper",
    "RewardError",
    "RewardFunctionError",
    "RewardTimeoutError",
    "RewardWorkerCrashedError",
    "default_max_workers",
    "gsm8k_reward_fn",
    "math_reward",
]

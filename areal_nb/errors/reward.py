"""`RewardError`'s kinds: a reward that could not be computed (the episode that needed it is
rejected).
"""

from __future__ import annotations

from .families import RewardError


class RewardTimeoutError(RewardError):
    """The reward function ran past its timeout."""


class RewardWorkerCrashedError(RewardError):
    """The worker process computing the reward died."""


class RewardFunctionError(RewardError):
    """The reward function raised."""


class JudgeError(RewardError):
    """An LLM judge did not answer in time, failed, or answered without a readable score (quoted)."""


class RewardValueError(RewardError, TypeError):
    """A reward function returned something that is not a finite number."""

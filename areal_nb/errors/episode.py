"""`EpisodeError`'s kinds: an agent's episode, or the rollout that runs it, that cannot go on or
must not be trained on.
"""

from __future__ import annotations

from .families import EpisodeError


class EpisodeRejected(EpisodeError):
    """The episode ran but its trajectory must not be trained on; `kind` names the reason's kind."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class EnvironmentServerError(EpisodeError, RuntimeError):
    """An environment's server cannot be started or reached, dropped the session or refused a message.

    Raised inside an episode, it rejects that episode with this message; the run goes on."""


class StalenessLimitError(EpisodeError, RuntimeError):
    """More rollouts were asked for than the staleness bound allows before the next training step."""


class FirstEpisodeError(EpisodeError, RuntimeError):
    """The agent failed on the first training row; the message holds the row and its traceback."""


class RolloutRejectedError(EpisodeError, RuntimeError):
    """Every episode of `MAX_EMPTY_BATCHES` batches in a row was rejected; the message lists why and where."""


class NoAcceptedEpisodesError(EpisodeError, ValueError):
    """A batch to train on whose every episode was rejected; the message lists why."""


class GroupMismatchError(EpisodeError, ValueError, TypeError):
    """The episodes of one group returned results that cannot be put together (an interaction id in
    two of them, different tensor keys, tensors mixed with interactions); a ValueError, and a
    TypeError too since a mix of kinds was one."""


class TaskAbandoned(EpisodeError):
    """The awaited code ignored its cancellation for the grace period; it was left running."""

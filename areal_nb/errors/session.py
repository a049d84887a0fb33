"""`SessionError`'s kinds: a Session or a training rank that cannot go on (closed, busy, a
process group that does not match the job, a failed leader).
"""

from __future__ import annotations

from .families import SessionError


class SessionClosedError(SessionError, RuntimeError):
    """Every method of a closed Session raises this (`close()` itself excepted)."""


class SessionBusyError(SessionError, RuntimeError):
    """A Session method was called from one thread while another thread's call was running."""


class ProcessGroupError(SessionError, RuntimeError):
    """The torchrun environment or process group does not match the job (unset RANK..., another
    world size); the message says how to start it."""


class LeaderFailed(SessionError, RuntimeError):
    """Rank 0 failed; raised on the other ranks with rank 0's error message."""

"""ArealError and the seven families under it: the classes to catch a kind of failure by.

Every other class of `areal_nb.errors` derives from exactly one of these (catch a family to catch
all its kinds). They add no builtin base but RewardError's (RuntimeError): a family spans several
builtins.
"""

from __future__ import annotations


class ArealError(Exception):
    """The base of every exception areal_nb raises on purpose."""

    # Errors cross process boundaries (agents in a process pool, the ranks of a job). Pickle's
    # default rebuilds one as `cls(*error.args)`, which fails or rewords the message for the
    # classes whose constructor takes other arguments (`ContextLengthExceeded(tokens, context)`):
    # rebuild from what the error holds instead, without calling the constructor again.
    def __reduce__(self) -> tuple[object, ...]:
        reduced = super().__reduce__()  # (cls, args[, state]); ImportError's state keeps `name`
        return (_unpickled, (type(self), reduced[1]), *reduced[2:])


def _unpickled(cls: type[ArealError], args: tuple[object, ...]) -> ArealError:
    """An error of `cls` holding `args`; pickle then restores its attributes."""
    return cls.__new__(cls, *args)


class RequestError(ArealError):
    """A request over HTTP failed: an answer a server gives, a body or client that broke off, a
    proxy endpoint that answered an error to its client."""


class EngineError(ArealError):
    """An inference engine or its server cannot serve: closed, down, failed to start, or refused a
    model file or adapter."""


class DataError(ArealError):
    """Data that cannot be read or written: dataset rows, an export, a checkpoint."""


class UsageError(ArealError):
    """areal_nb was configured or called wrongly: a config key, an argument, a missing package, a
    method called in the wrong state. The message says what to change."""


class EpisodeError(ArealError):
    """An agent's episode or the rollout that runs it cannot go on, or must not be trained on."""


class RewardError(ArealError, RuntimeError):
    """A reward could not be computed; the episode that needed it should be rejected."""


class SessionError(ArealError):
    """A Session or a training rank cannot go on: closed, busy, or its leader failed."""

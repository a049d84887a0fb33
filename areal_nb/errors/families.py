"""ArealError and the seven families under it: the classes to catch a kind of failure by.

Every other class of `areal_nb.errors` derives from exactly one of these (catch a family to catch
all its kinds). They add no builtin base but RewardError's (RuntimeError): a family spans several
builtins.
"""

from __future__ import annotations


class ArealError(Exception):
    """The base of every exception areal_nb raises on purpose."""


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

"""`UsageError`'s kinds: areal_nb configured or called wrongly (a config key, an argument, a
missing package, a call out of order).
"""

from __future__ import annotations

from .families import UsageError


class InvalidArgumentError(UsageError, ValueError):
    """An argument or setting outside what the function accepts; the message names it."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of a type the function does not accept; the message names it."""


class CallOrderError(UsageError, RuntimeError):
    """A method called in a state that does not allow it: before start, after stop, twice."""


class NotStartedError(UsageError, ValueError):
    """A value asked for that exists only once its owner started (a session id before `async with`)."""


class ConfigError(UsageError, ValueError):
    """A config file or override is invalid; the message names the key."""


class TrainMemoryError(UsageError, ValueError):
    """A training step estimated not to fit the device's free memory; the message names the setting to change."""


class MissingPackageError(UsageError, ImportError):
    """An optional package a feature needs is not installed; the message says what to pip install."""


class NotSerializableError(UsageError, TypeError):
    """User code cannot be sent to a worker process."""

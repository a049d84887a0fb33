"""`DataError`'s kinds: data that cannot be read or written (dataset rows, an export, a training
batch, a checkpoint).
"""

from __future__ import annotations

from .families import DataError


class DatasetError(DataError, ValueError):
    """A dataset that cannot be trained or evaluated on; the message names the row and why."""


class DatasetUnavailableError(DataError, RuntimeError):
    """A public dataset could not be fetched (offline, no access); the message says to pass a local file."""


class ExportError(DataError, ValueError):
    """The run cannot be exported (or an export, an interaction's wire form, cannot be read back);
    the message names what and why."""


class IncompleteInteractionError(DataError, ValueError):
    """A call's record lacks what is asked of it: no model response, no output yet (a call that
    has not returned, or a parent asked for before its child's prompt can be built)."""


class TrainBatchError(DataError, ValueError):
    """A training batch that cannot be trained on: a missing key, shapes that disagree, a mask not
    right-padded, fewer rows than minibatches; the message names the key."""


class CheckpointError(DataError, ValueError):
    """A checkpoint cannot be written where asked, or cannot be loaded: the message names the
    file and what is wrong with it."""

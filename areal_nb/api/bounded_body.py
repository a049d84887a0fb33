"""Moved to `areal_nb.serving.body`; this path keeps old imports working."""

from areal_nb.serving.body import BodyOverLimit, BodyTimedOut, read_bounded_body

__all__ = ["BodyOverLimit", "BodyTimedOut", "read_bounded_body"]

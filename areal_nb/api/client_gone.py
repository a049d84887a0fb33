"""Moved to `areal_nb.serving.disconnect`; this path keeps old imports working."""

from areal_nb.serving.disconnect import ClientGone, unless_client_leaves

__all__ = ["ClientGone", "unless_client_leaves"]

"""`import_object`: an import path a config names ("pkg.mod.name" or "pkg.mod:Name.attr") → the object.

Workflows (`rollout.resolve_workflow`) and reward functions (`reward.resolve_reward`) are named
this way in YAML configs; both spellings and the errors are the same for each.
"""

from __future__ import annotations

import importlib
from typing import Any

from areal_nb.errors import InvalidArgumentError


def import_object(path: str) -> Any:
    """The object `path` names: "pkg.mod:Name" (attributes after the colon, dots walk into it) or
    "pkg.mod.Name" (the last dot splits module from attribute).

    ValueError: `path` is not of either form; ImportError: the module cannot be imported or has
    no such attribute (the message names which).
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise InvalidArgumentError(
            f"{path!r} is not an import path like 'package.module.name' or 'package.module:name'"
        )
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} ({exc})") from exc
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    return found

"""`import_object`: an import path a config names ("pkg.mod.name" or "pkg.mod:Name.attr") → the object.

Workflows (`rollout.resolve_workflow`) and reward functions (`reward.resolve_reward`) are named
this way in YAML configs; both spellings and the errors are the same for each
(`import_named_object` words the errors for what the path names).
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


def import_named_object(
    path: str, *, not_a_path: str, import_error: type[Exception], cannot_import: str
) -> Any:
    """`import_object(path)` with errors in the caller's words: InvalidArgumentError(`not_a_path`)
    when `path` is not an import path, `import_error(f"{cannot_import}: <why>")` when the import fails."""
    try:
        return import_object(path)
    except ValueError:
        raise InvalidArgumentError(not_a_path) from None
    except ImportError as exc:
        raise import_error(f"{cannot_import}: {exc}") from exc

"""What a run folder can hold as written data: `ExportError` (what cannot travel, named),
`is_plain_data` (values config.yaml and agent.py write as literals and read back equal) and
`is_data_or_code` (what agent.py can write back as Python: data, functions and classes by name)."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from areal_nb.errors import ExportError  # noqa: F401 (re-exported)


def is_plain_data(value: Any) -> bool:
    """Data `repr` writes and `ast.literal_eval` reads back equal (numbers, strings, lists, dicts ...)."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def is_code(value: Any) -> bool:
    return inspect.isfunction(value) or inspect.isclass(value)


def is_data_or_code(value: Any) -> bool:
    """Plain data, a function or class, or dicts/lists/tuples of those (a ToolAgent's
    `{"lookup": (schema, lookup)}`): what agent.py can write back as Python."""
    if is_code(value) or is_plain_data(value):
        return True
    if isinstance(value, dict):
        return all(is_plain_data(k) and is_data_or_code(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(is_data_or_code(v) for v in value)
    return False

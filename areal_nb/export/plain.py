"""What a run folder can hold as written data: `ExportError` (what cannot travel, named) and
`is_plain_data` (values config.yaml and agent.py write as literals and read back equal)."""

from __future__ import annotations

import ast
from typing import Any


class ExportError(ValueError):
    """The run cannot be exported; the message names what and why."""


def is_plain_data(value: Any) -> bool:
    """Data `repr` writes and `ast.literal_eval` reads back equal (numbers, strings, lists, dicts ...)."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False

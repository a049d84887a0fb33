"""A pydantic validation error as one `ConfigError` in the words of the config file: each key,
what is wrong with it, a did-you-mean for an unknown key and the replacement of a removed one.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from areal_nb.errors import ConfigError

from .removed_keys import REMOVED_KEYS
from .session_config import SessionConfig


def _section_at(loc: tuple) -> Any:
    """The model or dataclass a validation error's location points into (for did-you-mean)."""
    node: Any = SessionConfig
    for part in loc:
        fields = field_types(node)
        if part not in fields:
            break
        node = fields[part]
    return node


def field_types(node: Any) -> dict[str, Any]:
    """A model's or a dataclass's fields and their annotations, as written."""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return {name: f.annotation for name, f in node.model_fields.items()}
    if dataclasses.is_dataclass(node):
        return {f.name: f.type for f in dataclasses.fields(node) if f.init}
    return {}


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true/false",
    "string": "a string",
    "dict": "a mapping",
    "list": "a list",
    "tuple": "a list",
    "dataclass": "a mapping",
    "model": "a mapping",
    "none": "null",
}


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as `key: what is wrong`, in the words of the config file."""
    loc = tuple(p for p in error["loc"] if not str(p).startswith("function-"))
    # pydantic adds the union member or dataclass name as a location step; drop those
    loc = tuple(p for p in loc if p not in ("int", "float", "str", "none", "GRPOConfig", "TaskConfig"))
    key = ".".join(str(p) for p in loc)
    kind, value = error["type"], error.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        removed = REMOVED_KEYS.get((str(loc[-2]), str(loc[-1]))) if len(loc) >= 2 else None
        if removed is not None:
            return f"{key} is no longer a config key: {removed}"
        names = list(field_types(_section_at(loc[:-1])))
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        prefix = ".".join(str(p) for p in loc[:-1])
        prefix = prefix + "." if prefix else ""
        hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys: {names}"
        return f"unknown config key {key!r}{hint}"
    if kind == "literal_error":
        return f"{key} must be one of {error['ctx']['expected']}, got {value!r}"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(error["ctx"].values()))
        return f"{key} must be {bounds[kind]} {limit}, got {value!r}"
    if kind == "value_error":  # a lower layer's own check (GRPOConfig) or a combination above
        message = str(error["ctx"]["error"])
        return f"{key}: {message}" if key else message
    if kind == "missing_keyword_only_argument" or kind == "missing":
        return f"{key}: required"
    base = kind.split("_")[0]
    if base in _TYPE_WORDS and kind.endswith(("_type", "_parsing", "_from_float", "_fraction")):
        return f"{key}: expected {_TYPE_WORDS[base]}, got {value!r}"
    return f"{key}: {error['msg']}, got {value!r}"


def config_error(exc: ValidationError, where: str = "") -> ConfigError:
    lines = [_describe(e) for e in exc.errors()]
    head = f"{where}: " if where else ""
    return ConfigError(head + "; ".join(lines))

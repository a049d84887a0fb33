"""`load_config`: a validated SessionConfig from a YAML file, a dict, a config or defaults, with
overrides; `dump_config`: the config as YAML. true/false where a number goes is refused before
pydantic would read it as 1/0.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from areal_nb.errors import ConfigError

from .overrides import apply_overrides, yaml_problem
from .removed_keys import without_retired_values
from .session_config import SessionConfig
from .validation_errors import config_error, field_types


def load_config(
    source: str | Path | dict | SessionConfig | None = None, overrides: Iterable[str] | dict[str, Any] = ()
) -> SessionConfig:
    """A validated SessionConfig from a YAML path, a dict, an existing config, or defaults."""
    where = ""
    if isinstance(source, SessionConfig):
        data = source.as_data()
    elif source is None:
        data = {}
    elif isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
        except (yaml.YAMLError, RecursionError) as exc:
            mark = getattr(exc, "problem_mark", None)
            where_in = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ConfigError(f"{path}: not readable YAML{where_in}: {yaml_problem(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        where = str(path)
    data = apply_overrides(data, overrides) if overrides else data
    data = without_retired_values(data)
    _refuse_bools_as_numbers(data, SessionConfig, "")
    try:
        return SessionConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, where) from None


def _numeric(annotation: Any) -> bool:
    """An int or float field (optional or not), not a bool one."""
    args = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else ()
    )
    kinds = set(args) - {type(None)} if args else {annotation}
    return bool(kinds) and kinds <= {int, float}


def _refuse_bools_as_numbers(data: Any, node: Any, prefix: str) -> None:
    """true/false where a number goes is an error, not 1/0 (pydantic would take a bool as an int)."""
    if not isinstance(data, dict):
        return
    fields = _resolved_field_types(node)
    for key, value in data.items():
        if key not in fields:
            continue
        annotation = fields[key]
        if isinstance(value, bool) and _numeric(annotation):
            count = annotation is int or int in typing.get_args(annotation)
            raise ConfigError(
                f"{prefix}{key}: expected {'an integer' if count else 'a number'}, got "
                f"{str(value).lower()} (a boolean is not a {'count' if count else 'number'})"
            )
        if isinstance(value, dict) and (
            isinstance(annotation, type)
            and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation))
        ):
            _refuse_bools_as_numbers(value, annotation, f"{prefix}{key}.")


def _resolved_field_types(node: Any) -> dict[str, Any]:
    """Field annotations as types (dataclasses of lower layers may hold them as strings)."""
    if dataclasses.is_dataclass(node):
        try:
            hints = typing.get_type_hints(node)
        except Exception:  # noqa: BLE001 - an unresolvable hint: that field is left to pydantic
            hints = {}
        return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(node) if f.init}
    return field_types(node)


def dump_config(cfg: SessionConfig, path: str | Path | None = None) -> str:
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return text

"""Dotted overrides applied to a config's plain data: `"actor.lr=1e-5"` strings (values parsed as
YAML scalars) or a `{"actor.lr": 1e-5}` mapping (values used as they are, so an agent instance
can be `agent.workflow`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel

from areal_nb.errors import ConfigError


def to_dict(cfg: Any) -> Any:
    """Plain nested data; objects that are not config data (an agent instance) are kept as they are."""
    if isinstance(cfg, BaseModel):
        return {name: to_dict(getattr(cfg, name)) for name in type(cfg).model_fields}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def _parse_override(item: str) -> tuple[str, Any]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. actor.lr=1e-5)")
    path, raw = item.split("=", 1)
    if not path.strip() or any(not part.strip() for part in path.strip().split(".")):
        raise ConfigError(
            f"override {_shorten(item)!r}: {_shorten(path)!r} is not a dotted config key (e.g. actor.lr)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        # YAML reserves @ ` % * & ! [ { " ' at the start of a value: quote such a text value
        shown = raw if len(raw) <= 80 else raw[:80] + "..."
        raise ConfigError(
            f"override {_shorten(item)!r}: YAML cannot read the value {shown!r} ({yaml_problem(exc)}); "
            f"to pass it as text, quote it: {_quoted(path, raw)}"
        ) from None
    # YAML 1.1 reads "1e-5" as a string; accept the forms people type for numbers.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return path, value


def yaml_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return " ".join(str(problem).split())


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _quoted(path: str, raw: str) -> str:
    """`path=<raw as a YAML double-quoted string>`, quoted for a POSIX shell."""
    text = raw if len(raw) <= 80 else raw[:80] + "..."
    return shlex.quote(f'{path}="' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')


def apply_overrides(data: dict, overrides: Iterable[str] | dict[str, Any]) -> dict:
    """Apply overrides to a nested dict: `"a.b.c=value"` strings (values parsed as YAML
    scalars) or a `{"a.b.c": value}` mapping (values used as they are)."""
    data = to_dict(data)  # copies the containers, keeps objects such as an agent instance
    items = overrides.items() if isinstance(overrides, dict) else (_parse_override(o) for o in overrides)
    for path, value in items:
        node = data
        parts = path.strip().split(".")
        for part in parts[:-1]:
            if part not in node:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {path!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data

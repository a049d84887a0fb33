"""An agent instance (`agent.workflow=MyAgent(turns=2)`) → the kwargs that rebuild it, checked by
rebuilding it: every `__init__` argument must be kept as an attribute of the same name, holding
plain data or code; what a subclass passes on through `**kwargs` is found; configuration that
cannot come back fails, naming it; other state (counters) only warns.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from .plain import ExportError, is_data_or_code, is_plain_data

logger = logging.getLogger(__name__)


def _constructor_kwargs(instance: Any) -> dict[str, Any]:
    """An agent instance → the kwargs that rebuild it: every `__init__` parameter must be kept
    as an attribute of the same name, holding plain data or code (a function or class, or
    dicts/lists/tuples of those)."""
    cls = type(instance)
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    state = getattr(instance, "__dict__", {})
    kwargs = {}
    for p in params:
        value = state.get(p.name)
        if p.name in state and is_data_or_code(value):
            if p.default is p.empty or value != p.default:
                kwargs[p.name] = value
        else:  # not kept under its name, or not data nor code: its value cannot be known
            raise ExportError(
                f"agent.workflow is an instance of {cls.__qualname__} whose argument {p.name!r} cannot be "
                f"recovered as plain data or code: pass the class and agent.workflow_kwargs instead "
                f"(Session(..., agent__workflow={cls.__qualname__}, agent__workflow_kwargs={{...}}))"
            )
    return kwargs


def rebuild_kwargs(instance: Any) -> dict[str, Any]:
    """The kwargs that rebuild `instance` (`_constructor_kwargs`), checked by rebuilding it here:
    the copy must hold the same data. An argument a subclass passes on through `**kwargs`
    (`Sub(bonus=1, max_turns=2)`) is found that way and added; one that still differs (set after
    the agent was made, or stored changed) fails, naming it, instead of being lost."""
    cls = type(instance)
    kwargs = _constructor_kwargs(instance)
    differ = _differences(instance, cls, kwargs)
    takes_more = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())
    # what a constructor in the class's bases takes is configuration; other attributes are state
    configured = {
        name
        for base in cls.__mro__
        if "__init__" in vars(base)
        for name in _parameters(vars(base)["__init__"])
    }
    passed_on = {name: vars(instance)[name] for name in differ if name in configured}
    if passed_on and takes_more:
        candidate = {**kwargs, **passed_on}
        try:
            if not set(_differences(instance, cls, candidate)) & configured:
                kwargs, differ = candidate, _differences(instance, cls, candidate)
        except ExportError:
            pass
    lost = [d for name, d in differ.items() if name in configured]
    if lost:
        shown = ", ".join(f"{name}={value!r} (rebuilt: {rebuilt})" for name, value, rebuilt in lost)
        raise ExportError(
            f"agent.workflow, an instance of {cls.__qualname__}, holds {shown}, which its constructor's "
            f"arguments ({', '.join(kwargs) or 'none'}) do not reproduce (was it set after the agent was made?): "
            f"pass the class and agent.workflow_kwargs, or take the value as a named argument"
        )
    if differ:  # counters and the like: the job's agent starts them afresh
        logger.warning(
            "agent.workflow %s: the exported agent starts without the values its attributes %s hold "
            "now (not constructor arguments)",
            cls.__qualname__,
            ", ".join(differ),
        )
    return kwargs


def _parameters(function: Any) -> list[str]:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _differences(instance: Any, cls: type, kwargs: dict[str, Any]) -> dict[str, tuple[str, Any, str]]:
    """The plain-data attributes of `instance` that `cls(**kwargs)` does not hold alike."""
    try:
        rebuilt = vars(cls(**kwargs))
    except Exception as exc:
        raise ExportError(
            f"agent.workflow, an instance of {cls.__qualname__}, cannot be rebuilt from the arguments "
            f"export recovered ({', '.join(kwargs) or 'none'}): {type(exc).__name__}: {exc}. Pass the "
            f"class and agent.workflow_kwargs instead"
        ) from exc
    return {
        name: (name, value, repr(rebuilt[name]) if name in rebuilt else "unset")
        for name, value in getattr(instance, "__dict__", {}).items()
        if is_plain_data(value) and (name not in rebuilt or rebuilt[name] != value)
    }

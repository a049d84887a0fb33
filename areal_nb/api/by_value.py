"""Ship user code (reward functions, agents) to spawned worker processes by value.

A spawned worker starts a fresh interpreter and unpickles what it is sent. Plain `pickle`
sends functions and classes *by reference* (module + name), so anything defined in a notebook
cell (`__main__`) cannot be found there. `cloudpickle` — what Ray and Dask use — sends objects
from `__main__` (and lambdas, closures) by value, and importable ones by reference as before.

`dumps_by_value` raises `NotSerializableError` naming the object and, where it can find it, the
variable that holds the part that cannot travel (a lock, a socket, an open file ...).
"""

from __future__ import annotations

import inspect
from typing import Any

import cloudpickle

from areal_nb.errors import NotSerializableError  # noqa: F401 (re-exported)

__all__ = ["NotSerializableError", "dumps_by_value", "loads_by_value"]


def dumps_by_value(obj: Any, what: str) -> bytes:
    """`cloudpickle.dumps(obj)`, or NotSerializableError saying which part of `what` failed."""
    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError ...
        culprit = _culprit(obj)
        where = f": {culprit}" if culprit else ""
        raise NotSerializableError(
            f"{what} {_name(obj)} cannot be sent to a worker process{where} ({type(exc).__name__}: {exc}). "
            "Create such resources inside the function (or the agent's run), not around it."
        ) from exc


def loads_by_value(payload: bytes) -> Any:
    """The object back (a fresh copy on every call)."""
    return cloudpickle.loads(payload)


def _name(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or f"{type(obj).__qualname__} instance"
    return repr(name)


def _fails(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001
        return True
    return False


def _culprit(obj: Any) -> str | None:
    """The first closure variable, global or attribute of `obj` that cannot be pickled."""
    target = getattr(obj, "__func__", obj)  # bound method → its function
    if inspect.isfunction(target):
        code = target.__code__
        for name, cell in zip(code.co_freevars, target.__closure__ or (), strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # empty cell
                continue
            if _fails(value):
                return f"its closure variable {name!r} ({type(value).__qualname__}) cannot be pickled"
        for name in code.co_names:
            if name in target.__globals__ and _fails(target.__globals__[name]):
                value = target.__globals__[name]
                return f"the global {name!r} it uses ({type(value).__qualname__}) cannot be pickled"
        return None
    for name, value in getattr(obj, "__dict__", {}).items():
        if _fails(value):
            return f"its attribute {name!r} ({type(value).__qualname__}) cannot be pickled"
    return None

"""What a Session says when it is used in a way it cannot serve: closed, or called from two
threads at once.

A Session runs one call at a time. A call from a second thread while one runs is refused with
`SessionBusyError` naming both calls, rather than queued: two threads stepping one Session would
interleave their data draws, rollouts and weight versions in an order neither chose (the data
stream and the staleness budget are the Session's single state), and waiting silently would hide
that. Calls nested inside a call of the same thread (`step` → `rollout`, `run` → `save`) are the
same call. `close()` is the exception: any thread may call it, at any time, any number of times.
Sessions still open when the interpreter exits are closed then (`live`): no engine server or
proxy port outlives the notebook.
"""

from __future__ import annotations

import atexit
import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

from areal_nb.errors import SessionBusyError, SessionClosedError

F = TypeVar("F", bound=Callable[..., Any])

CLOSED_MESSAGE = "this Session is closed; create a new one (or Session.load a checkpoint)"


class OneCallAtATime:
    """The thread whose call is running, and which call it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._owner_name = ""
        self._call = ""
        self._depth = 0

    @contextmanager
    def enter(self, call: str) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            if self._owner is not None and self._owner != me:
                raise SessionBusyError(
                    f"Session.{call}() was called from thread {threading.current_thread().name!r} while "
                    f"Session.{self._call}() runs in thread {self._owner_name!r}: a Session runs one call at a "
                    f"time; wait for that call to return (or use one Session per thread)"
                )
            if self._owner is None:
                self._owner, self._owner_name, self._call = me, threading.current_thread().name, call
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._owner, self._owner_name, self._call = None, "", ""


def one_call(method: F) -> F:
    """A Session method that refuses a closed Session and a second thread."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise SessionClosedError(CLOSED_MESSAGE)
        with self._calls.enter(method.__name__):
            return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


class Closing:
    """The lifecycle plumbing of a Session: `with Session(...) as s:` starts it and closes it, and
    a Session dropped without `close()` is closed (its threads, ports and servers released)."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - (at garbage collection: nowhere to report to)
            pass


class _LiveSessions(weakref.WeakSet):
    """The Sessions started and not closed yet: `close()`d at the interpreter's exit."""

    def close_all(self) -> None:
        for session in list(self):
            try:
                session.close()
            except Exception:  # noqa: BLE001 - the others must close too
                pass


live = _LiveSessions()
atexit.register(live.close_all)

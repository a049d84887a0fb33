"""Shorter GIL time slices while episodes are in flight: `SwitchIntervalLease`.

Why: during a rollout two Python threads want the GIL at once. The engine's worker thread
(`LocalEngine`) releases it around every torch op and must take it back when the op returns;
the Session's loop thread runs agents, the in-process proxy, chat templates and rewards, and
keeps the GIL until it blocks or until the interpreter forces a switch after
`sys.getswitchinterval()` (5 ms by default). So each of the hundreds of torch ops in a decoding
step can wait up to 5 ms for the GIL while the loop thread is busy: a convoy that made the
engine's decode 1.3-3x slower inside a Session than alone. With a 0.2 ms interval the engine
gets the GIL back within 0.2 ms. Measured on a shared 2-core machine, alternating steps in one
process: the engine's busy time per single-turn rollout fell 6-22 %, the single-turn step itself
did not move steadily (paired median 1.01x at load 3.5); a multi-turn A/B at 0.5 ms gave 4.2 ->
2.7 s in one run and 2.4 vs 2.5 s in another. On a quiet machine it first took the single-turn
step from 0.74-0.78 to 0.66-0.71 s; after the session's other changes five interleaved quiet
pairs gave 0.48-0.73 s with it and 0.51-0.56 s without (medians 0.51 vs 0.55 s). Still not
settled: the default keeps it, `rollout.gil_switch_interval=null` turns it off.

The interval is process-wide (`sys.setswitchinterval`), so it is taken as a lease: the first
holder saves the caller's value and sets the shortest interval any holder asks for; the last
release puts the saved value back, unless someone else changed the interval in the meantime
(then theirs is kept). Several executors (two Sessions, or a Session's training and evaluation
rollouts) may hold leases at once; each lease is held at most once, and releasing one that is
not held does nothing, so error and cancel paths may release unconditionally.
"""

from __future__ import annotations

import sys
import threading

from areal_nb.errors import InvalidArgumentError

_lock = threading.Lock()
_requests: list[float] = []  # the interval each held lease asks for
_saved: float | None = None  # the caller's interval before the first lease
_applied: float | None = None  # what we set (read back: the interpreter rounds to microseconds)


def _apply_locked() -> None:
    global _saved, _applied
    current = sys.getswitchinterval()
    if not _requests:
        if _applied is not None and current == _applied and _saved is not None:
            sys.setswitchinterval(_saved)  # nobody changed it while leased: give the caller's back
        _saved = _applied = None
        return
    if _applied is None:
        _saved = current
    elif current != _applied:
        _saved = current  # changed by someone else while leased: that is the value to restore
    sys.setswitchinterval(min(_requests))
    _applied = sys.getswitchinterval()


class SwitchIntervalLease:
    """`acquire()` sets `sys.setswitchinterval(interval)` (shared, see the module docstring);
    `release()` gives it back. `interval=None` makes both do nothing."""

    def __init__(self, interval: float | None) -> None:
        if interval is not None and not interval > 0:
            raise InvalidArgumentError(
                f"switch interval must be a positive number of seconds or None, got {interval!r}"
            )
        self.interval = interval
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    def acquire(self) -> None:
        if self.interval is None:
            return
        with _lock:
            if self._held:
                return
            self._held = True
            _requests.append(self.interval)
            _apply_locked()

    def release(self) -> None:
        with _lock:
            if not self._held:
                return
            self._held = False
            assert self.interval is not None  # held only after acquire appended it
            _requests.remove(self.interval)
            _apply_locked()

    def __enter__(self) -> SwitchIntervalLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

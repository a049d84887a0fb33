"""`AdmissionWindow`: lets a burst of requests that reaches an idle engine start as one batch.

Over HTTP the N requests of a rollout round arrive one by one, a fraction of a millisecond to a
few milliseconds apart (each is sent, parsed and validated in turn). Handed to the engine as they
come, the first one starts alone: the engine prefills it, decodes it for a few steps, then prefills
the other N-1 when they arrive and decodes every step after that with all N. The lone steps and the
extra prefill are pure overhead, and while the engine runs them it competes for the CPU and the
GIL with the very thread that is still reading the rest of the burst.

So when a request finds the engine idle (nothing of ours in flight), it waits until no new request
has arrived for `gap` seconds (at most `max_wait` seconds in all), and every request that arrived
meanwhile is released with it. Requests that arrive while the engine is busy go straight in: the
engine admits them at its next step anyway. A lone request pays `gap` of latency.

engine-server's default gap is 8 ms: a client that sends a burst from another thread of its process
(`SGLangEngine`'s loop thread) could stall up to its own GIL switch interval (5 ms) after the first
request; with a 2 ms gap the first request still started alone in most rounds, with 8 ms the burst
took one prefill (1 thread, load 5-9). Since `SGLangEngine` starts a submitted burst in one wake-up
of its loop, the burst reaches the server in ~5 ms instead of ~15 (median, instant
engine, load 7), but the largest gap inside a burst is still 5-7 ms in a quarter of the rounds at
that load: with a 4 ms gap 10-30% of the bursts split (2 ms: 33%), with 8 ms 6-10%, so 8 ms stays.
A window whose timer fires in the same loop turn that read the rest of the burst (the loop thread
was kept off the CPU past the timer) releases one turn later, after those requests have joined it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from areal_nb.errors import InvalidArgumentError

# `areal-nb engine-server --admission-gap / --admission-max-wait` (see the module docstring for 8 ms)
DEFAULT_ADMISSION_GAP = 0.008
DEFAULT_ADMISSION_MAX_WAIT = 0.03


class AdmissionWindow:
    """See the module docstring. Used on one event loop; `engine_busy()` says whether our requests
    are in the engine."""

    def __init__(self, gap: float, max_wait: float, engine_busy: Callable[[], bool]) -> None:
        if gap < 0 or max_wait < 0:
            raise InvalidArgumentError(f"admission gap and max_wait must be >= 0, got {gap} and {max_wait}")
        self.gap = gap
        self.max_wait = max_wait
        self.engine_busy = engine_busy
        self._open: asyncio.Event | None = None  # the window being collected, if any
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.windows = 0  # bursts held back (for benchmarks and tests)
        self.held = 0  # requests held back in them

    async def wait(self) -> None:
        """Return when this request may go to the engine."""
        if self.gap <= 0 or (self._open is None and self.engine_busy()):
            return
        loop = asyncio.get_running_loop()
        if self._open is None:
            self._open = asyncio.Event()
            self._deadline = loop.time() + self.max_wait
            self.windows += 1
        self.held += 1
        if self._timer is not None:
            self._timer.cancel()
        # every arrival pushes the release back by `gap`, never past the deadline
        self._timer = loop.call_at(min(loop.time() + self.gap, self._deadline), self._due, self._open)
        await self._open.wait()  # an Event: a cancelled waiter leaves the others untouched

    def _due(self, window: asyncio.Event) -> None:
        # One loop iteration later: when the loop thread was kept off the CPU past the timer, the
        # rest of the burst's bytes were read in the same iteration as the timer fired, and their
        # handlers start only in the next one; released now, the window would start the engine with
        # the first request alone and the others would join the running batch (2 prefills, 31 rows
        # joined, seen at load 7-9). Their handlers run before this callback and join the window.
        asyncio.get_running_loop().call_soon(self._release, window)

    def _release(self, window: asyncio.Event) -> None:
        if self._open is window:
            self._open = None
            if self._timer is not None:  # set by a request that joined after the timer fired
                self._timer.cancel()
            self._timer = None
        window.set()

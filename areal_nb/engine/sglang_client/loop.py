"""`EngineLoop`: the event loop `SGLangEngine` owns, in a daemon thread of its own.

Every HTTP call of the engine runs on this loop (its connection pool lives there). `run(coro)`
is awaited from any loop in any thread and carries cancellation both ways; `call(coro)` blocks a
thread that is not the loop's own. Coroutines submitted from another thread before the loop wakes
up start in one wake-up (`submit`): a rollout's burst then leaves back to back instead of
interleaved with GIL hand-overs between the two threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from areal_nb.errors import CallOrderError, EngineServerError

T = TypeVar("T")


class EngineLoop:
    """See the module docstring; `name` is the thread's (`SGLangEngine-loop`)."""

    def __init__(self, name: str = "SGLangEngine-loop") -> None:
        self._inbox: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future]] = []
        self._inbox_lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise CallOrderError(
                "SGLangEngine's sync methods cannot run on its own loop; await the a-methods"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the engine loop from whatever loop awaits this; cancellation propagates."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            # outside the try above: a RuntimeError the coroutine raises (EngineServerError is one)
            # must reach the caller, not send the spent coroutine to submit
            return await coro
        fut = self.submit(coro)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """`run_coroutine_threadsafe` for a burst: coroutines submitted before the engine loop
        wakes up start in one wake-up (one self-pipe write and one GIL hand-over for the burst, not
        one per request; the hand-overs are what spread a burst's sends over several milliseconds)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._inbox_lock:
            self._inbox.append((coro, fut))
            if len(self._inbox) > 1:
                return fut  # a wake-up is already on its way
        try:
            self.loop.call_soon_threadsafe(self._start_submitted)
        except RuntimeError:  # the loop is closed
            with self._inbox_lock:
                self._inbox.clear()
            coro.close()
            fut.set_exception(EngineServerError("SGLangEngine is closed"))
        return fut

    def _start_submitted(self) -> None:
        with self._inbox_lock:
            batch, self._inbox = self._inbox, []
        for coro, fut in batch:
            if fut.cancelled():  # the caller gave up before it started
                coro.close()
                continue
            task = self.loop.create_task(coro)
            task.add_done_callback(functools.partial(_copy_outcome, fut))
            fut.add_done_callback(functools.partial(_cancel_task_from_any_thread, self.loop, task))

    def stop(self) -> None:
        """Stop the loop and its thread (what still runs on it is dropped), then close it."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


def _copy_outcome(fut: concurrent.futures.Future, task: asyncio.Task) -> None:
    # `fut` stays pending while the task runs, so the caller can still cancel it (and with it the task)
    if task.cancelled():
        fut.cancel()
    elif not fut.set_running_or_notify_cancel():  # cancelled by the caller meanwhile
        return
    elif task.exception() is not None:
        fut.set_exception(task.exception())
    else:
        fut.set_result(task.result())


def _cancel_task_from_any_thread(
    loop: asyncio.AbstractEventLoop, task: asyncio.Task, fut: concurrent.futures.Future
) -> None:
    if fut.cancelled() and not task.done():
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closed
            pass

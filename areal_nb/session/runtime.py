"""The Session's background event loop and the bridge from notebook cells to it.

One daemon thread runs an asyncio loop; the rollout executor, the agents and their HTTP clients
live there. A cell calls `runtime.call(coro)` and blocks on the result; Ctrl-C in the cell
cancels that coroutine, runs the registered interrupt clean-up on the loop (the Session cancels
its rollouts), and re-raises, so the Session stays usable (docs/design.md §3).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LoopRuntime:
    def __init__(
        self,
        name: str = "areal-nb-session-loop",
        on_interrupt: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.on_interrupt = on_interrupt
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for it; Ctrl-C cancels it and cleans up."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except KeyboardInterrupt:
            future.cancel()
            if self.on_interrupt is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self.on_interrupt(), self.loop).result(30)
                except Exception as e:  # the interrupt must still reach the cell
                    logger.warning("cleanup after interrupt failed: %s", e)
            raise

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's thread (where `call` would wait on itself)."""
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain function on the loop (objects owned by the loop are touched there)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

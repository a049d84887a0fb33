"""`run_within(awaitable, timeout)`: await with a deadline that holds even against code that
swallows cancellation.

`asyncio.wait_for` cancels the awaited task at its deadline and then waits for it to finish,
for as long as that takes: an agent whose retry loop has a bare `except:` catches the
cancellation and goes on, and the caller waits with it. Here the task is cancelled, given
`grace` seconds to stop, and otherwise abandoned (`TaskAbandoned`): it goes on running on the
loop, but nobody waits for it, and its exception, if it ever ends with one, is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

CANCEL_GRACE_S = 5.0  # how long cancelled code may take to stop before it is abandoned
# Abandoned tasks, held until they end: a pending task that is garbage-collected has its coroutine
# closed, and code that swallows every exception would then spin in whatever thread collects it
_ABANDONED: set[asyncio.Future[Any]] = set()


class TaskAbandoned(Exception):
    """The awaited code ignored its cancellation for the grace period; it was left running."""


async def run_within(awaitable: Awaitable[T], timeout: float | None, *, grace: float = CANCEL_GRACE_S,
                     what: str = "the task") -> T:
    """`await awaitable` for at most `timeout` seconds (None: no deadline): TimeoutError when it
    stopped on cancellation, TaskAbandoned when it did not within `grace`. Cancelling the caller
    cancels it too, bounded the same way."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        await stop(task, grace, what)
        raise
    if task in done:
        return task.result()
    if await stop(task, grace, what):
        raise TimeoutError(f"{what} did not finish within {timeout} s")
    raise TaskAbandoned(f"{what} did not finish within {timeout} s and ignored its cancellation for {grace} s "
                        f"(does it catch CancelledError, e.g. with a bare `except:`?); abandoned, still running")


async def stop(task: asyncio.Future[Any], grace: float = CANCEL_GRACE_S, what: str = "the task") -> bool:
    """Cancel `task` and wait up to `grace` s for it to end; False when it did not (abandoned)."""
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=grace)
    except asyncio.CancelledError:
        if not task.done():
            _abandon(task)
        raise
    if task.done():
        _retrieve(task)
        return True
    logger.warning("%s ignored its cancellation for %s s: abandoned (it goes on running)", what, grace)
    _abandon(task)
    return False


def _abandon(task: asyncio.Future[Any]) -> None:
    _ABANDONED.add(task)
    task.add_done_callback(_ABANDONED.discard)
    task.add_done_callback(_log_outcome)


def _retrieve(task: asyncio.Future[Any]) -> BaseException | None:
    """The task's exception, read so asyncio does not report it as never retrieved."""
    if task.cancelled():
        return None
    return task.exception()


def _log_outcome(task: asyncio.Future[Any]) -> None:
    error = _retrieve(task)
    if error is not None:
        logger.warning("an abandoned task ended with %r", error)

"""`unless_client_leaves(call, receive)`: an ASGI handler's work, cancelled if its client disconnects.

Shared by the proxy's generation routes and the engine-server's `/generate`: a reply nobody will
read would only keep the engine busy (a flood of abandoned requests would starve everyone else),
and a cancelled call records nothing. After the request body, the next ASGI message is
`http.disconnect`, sent when the connection drops (or once the response is complete).

One watcher task per request, which cancels the handler's own task: cheaper than racing two
tasks with `asyncio.wait`, on a path every rollout request takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from areal_nb.errors import ClientGone

T = TypeVar("T")


async def unless_client_leaves(
    call: Awaitable[T], receive: Callable[[], Awaitable[MutableMapping[str, Any]]]
) -> T:
    handler = asyncio.current_task()
    assert handler is not None
    left = False

    async def watch() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await call
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled from outside (shutdown): not ours to swallow
        handler.uncancel()
        raise ClientGone from None
    finally:
        watcher.cancel()

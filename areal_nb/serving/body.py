"""`read_bounded_body`: an ASGI request body read whole, within a size and a time limit.

Shared by the proxy's body-limit middleware and the engine-server's routes, which answer the
outcomes in their own error formats: a body past the limit (413: a Content-Length over it is
refused before anything is read), a body not complete `timeout` seconds after its headers (408: a
slow-loris client would otherwise hold its connection and buffer forever), or a client that left
before sending it all (nothing to answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from areal_nb.errors import BodyOverLimit, BodyTimedOut


async def read_bounded_body(
    scope: Mapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    limit: int,
    timeout: float,
) -> bytes | None:
    """The whole body, or None if the client disconnected before sending it all."""
    declared = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), None)
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            length = 0  # the server rejects malformed lengths itself
        if length > limit:
            raise BodyOverLimit(length)
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":  # disconnected while sending the body
                    return None
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > limit:
                    raise BodyOverLimit()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise BodyTimedOut(received) from None

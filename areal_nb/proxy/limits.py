"""Request-body size limit (413), checked on Content-Length and again while reading."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from .errors import error_response


class BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body; an HTTPException so FastAPI passes it through as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body too large: the limit is {limit} bytes")


class BodyLimitMiddleware:
    """Pure ASGI middleware: cheap on the hot path (one header lookup, one counter)."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_large = int(value) > limit
                except ValueError:
                    too_large = False  # the server rejects malformed lengths itself
                if too_large:
                    response = error_response(scope.get("path", ""), 413, BodyTooLarge(limit).detail, "body_too_large")
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)

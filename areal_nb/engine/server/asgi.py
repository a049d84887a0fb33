"""The engine-server's HTTP plumbing below FastAPI: `/generate` as a plain ASGI route, the key
check, bodies read within their limits, JSON answers, and errors in SGLang's shape.

`/generate` is called once per rollout request, on the thread that shares the GIL with the
engine; FastAPI's per-request machinery was half of its CPU, so it is served here in front of the
FastAPI app that serves every other route.

The key check is not `serving.auth.bearer_token_of`: SGLang's `--api-key` accepts exactly
`Authorization: Bearer KEY` (no `x-api-key`, no other spelling of the scheme), and so does this.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from areal_nb.errors import BadRequest, BodyError, ContractViolation, HTTPError, render_error
from areal_nb.serving import BodyOverLimit, BodyTimedOut, ClientGone, read_bounded_body, unless_client_leaves

from .translate import validation_message

logger = logging.getLogger(__name__)


class APIKeyMiddleware:
    """`Authorization: Bearer KEY` on every route but `/health*` (as sglang's --api-key), else 401.

    A plain ASGI middleware: `@app.middleware("http")` (Starlette's BaseHTTPMiddleware) runs each
    request through an extra task and memory stream, which was the largest CPU cost per /generate."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/health"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class GenerateRoute:
    """`/generate` as a plain ASGI app in front of FastAPI; every other path goes on to FastAPI.

    The same handler, validation and 400 bodies as a FastAPI route would give, without FastAPI's
    per-request machinery (its middleware stack, two AsyncExitStacks, dependency solving, the
    Request object): that was about half of the server's CPU per /generate, spent on the thread
    that shares the GIL with the engine. Bad input is a 400 (`error_body`); an unexpected error
    is a 500 with its traceback logged, as FastAPI's ServerErrorMiddleware does."""

    def __init__(
        self,
        app: ASGIApp,
        handle: Callable[[bytes], Awaitable[Any]],
        read_body: Callable[..., Awaitable[bytes]],
    ) -> None:
        self.app = app
        self.handle = handle
        self.read_body = read_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("POST", "PUT"):
            await send_json(send, 405, {"detail": "Method Not Allowed"}, [(b"allow", b"POST, PUT")])
            return
        try:
            content = await unless_client_leaves(self.handle(await self.read_body(scope, receive)), receive)
        except ClientGone:
            return  # nobody to answer; the generation was aborted (as sglang aborts a disconnected request)
        except BodyError as exc:
            await send_json(send, exc.status, sglang_error(exc.status, str(exc)), [(b"connection", b"close")])
            return
        except (BadRequest, ValidationError) as exc:
            await send_json(send, 400, error_body(exc))
            return
        except Exception:
            logger.exception("engine-server: /generate failed")
            await send_json(send, 500, sglang_error(500, "Internal Server Error"))
            return
        await send_json(send, 200, content)


async def read_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
    """The whole body; BodyError 413 past `limit` bytes (Content-Length first), 408 past `timeout`
    s; ClientGone if the client left before sending it all."""
    try:
        body = await read_bounded_body(scope, receive, limit, timeout)
    except BodyOverLimit as exc:
        size = f"{exc.declared} bytes; the limit is" if exc.declared is not None else "the limit is"
        raise BodyError(413, f"request body too large: {size} {limit} bytes") from None
    except BodyTimedOut as exc:
        raise BodyError(
            408,
            f"the request body was not complete {timeout:g} s after its headers "
            f"({exc.received} bytes arrived)",
        ) from None
    if body is None:
        raise ClientGone
    return body


async def send_json(
    send: Send, status: int, content: Any, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    # orjson, as sglang answers: a /generate reply is mostly numbers, which it encodes several
    # times faster than the stdlib; like sglang's, a non-finite float is written as null
    body = orjson.dumps(content)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def sglang_error(status: int, message: str) -> dict[str, Any]:
    """An error body in SGLang's shape, `{"error": {"message", "code"}}` (`render_error`'s "sglang"
    dialect: the `ErrorBody` of SGLang's API types, which its own clients decode)."""
    return render_error(HTTPError(message, status=status), "sglang").body


def error_body(exc: HTTPError | ValidationError) -> dict[str, Any]:
    if isinstance(exc, ValidationError):
        exc = ContractViolation(validation_message(exc))
    return render_error(exc, "sglang").body

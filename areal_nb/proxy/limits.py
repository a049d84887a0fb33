"""Checks on the raw request body, before any route parses it.

- size: 413 above the body limit, checked on Content-Length and again while reading. The limit
  is `ProxySettings.max_body_bytes`, lowered to what the model's context can use when the
  engine reports one (`body_limit`): parsing megabytes a 512-token model can never read would
  only stall the event loop;
- JSON nesting: 400 above `MAX_JSON_DEPTH` levels (deep nesting makes every recursive consumer —
  pydantic, copying, templates, export — raise `RecursionError`);
- text: 400 for bytes that are not UTF-8 (what JSON must be sent in), and for a lone UTF-16 surrogate (`"\\ud800"`) anywhere in the body, rendered or not: it
  is valid JSON but no valid text, and would only fail later (at export, after the episode).

- time: 408 when the body is not complete `body_timeout` seconds after the headers (a client
  that trickles a body, or stops sending one, would otherwise hold its connection and its
  request for ever);

Bodies larger than `THREAD_BYTES` are inspected in a worker thread so a large request never
stalls the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np

from areal_nb.errors import BodyTooLarge
from areal_nb.serving.body import BodyOverLimit, BodyTimedOut, read_bounded_body

from .errors import error_response, http_error_response

MAX_JSON_DEPTH = 64
THREAD_BYTES = 256 * 1024
# A prompt character costs at most 12 body bytes (a surrogate pair escaped as \uXXXX\uXXXX);
# the rest of a body (tools' schemas, metadata) gets the same again, and never less than 1 MiB.
_BODY_BYTES_PER_PROMPT_CHAR = 24
_MIN_CONTEXT_BODY_BYTES = 1024 * 1024


def body_limit(configured: int, context: int | None, chars_per_token: int | None) -> int:
    """The body limit: `configured`, or less when the model's context bounds what is useful."""
    if context is None or chars_per_token is None:
        return configured
    return min(
        configured, max(_MIN_CONTEXT_BODY_BYTES, _BODY_BYTES_PER_PROMPT_CHAR * context * chars_per_token)
    )


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_depth(body: bytes, at_least: int = 0) -> int:
    """Deepest bracket nesting of a JSON text (strings skipped; exact for valid JSON).

    Bodies with at most `at_least` brackets in all are not scanned: 0 is returned.
    """
    if body.count(b"[") + body.count(b"{") <= at_least:
        return 0
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", body)).translate(None, _NOT_BRACKETS)
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max()) if len(steps) else 0


def _lone_surrogate_path(body: bytes) -> str | None:
    """Where the first lone surrogate in a JSON body is (`messages[0].content`), or None."""
    if not _SURROGATE_ESCAPE.search(body):
        return None  # raw UTF-8 cannot hold surrogates; only \uD8xx..\uDFxx escapes can
    try:
        stack: list[tuple[str, Any]] = [("body", json.loads(body))]
    except ValueError:
        return None  # not JSON: the route answers that itself
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return f"{where} (a key)"
                stack.append((f"{where}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def body_problem(body: bytes) -> tuple[str, str] | None:
    """(message, code) for a body no route should parse, or None."""
    depth = _json_depth(body, at_least=MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        return (
            f"JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH} levels are accepted",
            "nesting_too_deep",
        )
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"request body is not valid UTF-8: byte 0x{body[exc.start]:02x} at offset {exc.start}; "
            "JSON must be sent as UTF-8",
            "invalid_utf8",
        )
    where = _lone_surrogate_path(body)
    if where is not None:
        return (
            f"invalid text in {where}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not a character; "
            "send valid Unicode",
            "invalid_unicode",
        )
    return None


class BodyLimitMiddleware:
    """Pure ASGI middleware: reads the body (bounded), checks it, then replays it to the app."""

    def __init__(self, app: Any, max_body_bytes: int, body_timeout: float = 30.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        path = scope.get("path", "")
        try:
            body = await read_bounded_body(scope, receive, limit, self.body_timeout)
        except BodyOverLimit:
            await http_error_response(path, BodyTooLarge(limit))(scope, receive, send)
            return
        except BodyTimedOut as exc:
            message = (
                f"the request body was not complete {self.body_timeout:g} s after its headers "
                f"({exc.received} bytes arrived); send the whole body at once"
            )
            response = error_response(path, 408, message, "body_timeout")
            response.headers["connection"] = "close"  # the rest of the body would be read as the next request
            await response(scope, receive, send)
            return
        if body is None:  # disconnected while sending the body
            return
        if body:
            problem = (
                await asyncio.to_thread(body_problem, body)
                if len(body) > THREAD_BYTES
                else body_problem(body)
            )
            if problem is not None:
                await error_response(path, 400, *problem)(scope, receive, send)
                return

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as usual

        await self.app(scope, replay, send)

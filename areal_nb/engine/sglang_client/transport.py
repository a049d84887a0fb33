"""`SGLangEngine`'s HTTP calls to its servers, over one aiohttp connection pool on the engine loop.

Two stacks share that pool: `/generate`, the hot path, goes to the aiohttp session directly (an
orjson body, no httpx objects: half the client's CPU per call); every control call goes through
an `httpx.AsyncClient` over the same session (`httpx-aiohttp`), for httpx's API and errors.

Failure. Connecting times out after `connect_timeout` s. A transport error on a request marks that
server down if it also fails `/health` (a keep-alive connection closed as it was reused is not a
dead server): the request fails with `ServerDownError` naming the server and the cause. A 400 from
a server is an `EngineRefused` (an `InvalidRequestError`, so a `ValueError`) with its message:
the proxy answers the agent 400 too; any other non-200 is an `EngineServerError`. A `/generate`
the server refuses because its prompt leaves no room in the model's context is a
`ContextLengthExceeded` instead (so each proxy door words it as its API words an overflow), when
the server's limit is known (from its message, else `max_context`); a prompt that fits but asks
too many new tokens stays an `EngineRefused`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from areal_nb.errors import ContextLengthExceeded, EngineRefused, EngineServerError, ServerDownError

from ..sglang_wire import GeneratePayload
from .routing import Server, ServerPool, mark_down


class ServerCalls:
    """The HTTP calls of `SGLangEngine` (a base class of it: they share its pool and state).
    Every method runs on the engine loop."""

    servers: list[Server]
    max_context: int | None
    _pool: ServerPool
    _session: aiohttp.ClientSession
    _client: httpx.AsyncClient
    _timeout: httpx.Timeout
    _generate_timeout: aiohttp.ClientTimeout
    _generate_headers: dict[str, str]
    _closed: bool

    async def _make_client(self, headers: dict[str, str]) -> httpx.AsyncClient:
        # httpx's API over aiohttp's connection pool (httpx-aiohttp, as the openai/anthropic SDKs
        # offer): httpcore's own pool scans every connection on every request event, which cost
        # 2-3 ms of CPU per /generate at 32 concurrent requests on the development machine, aiohttp
        # about 0.5 ms. No connection cap (limit=0): a capped pool would cap how many requests a
        # server batches. Idle connections are kept 60 s, less than the servers keep them (uvicorn
        # in engine-server: 300 s), so the client, not the server, closes an idle one: a request is
        # never sent on a connection the server is closing.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0))
        return httpx.AsyncClient(
            transport=AiohttpTransport(client=self._session), timeout=self._timeout, headers=headers
        )

    async def _generate_on(self, server: Server, payload: GeneratePayload) -> Any:
        task = asyncio.current_task()
        assert task is not None
        server.in_flight += 1
        server.tasks.add(task)
        try:
            # The hot path skips httpx's request/response objects and goes to the aiohttp session
            # under it (same pool, same timeouts, aiohttp's errors mapped to httpx's as on every
            # other call), with an orjson body: that halved the client's CPU per /generate
            # (0.57 -> 0.28 ms), which is what spaces the requests of a burst apart on the wire.
            with map_aiohttp_exceptions():
                async with self._session.post(
                    f"{server.url}/generate",
                    data=orjson.dumps(payload),
                    headers=self._generate_headers,
                    timeout=self._generate_timeout,
                ) as reply:
                    status, body = reply.status, await reply.read()
        except httpx.TransportError as exc:
            reason = transport_reason(exc)
            # A dropped connection is not always a dead server (a keep-alive connection closed as
            # it was reused; measured once in a 60-step run): only a server that also fails
            # /health is taken out. Either way this request failed.
            if await self._answers_health(server):
                raise EngineServerError(
                    f"engine server {server.url}: request failed ({reason}); "
                    "the server is up and stays in use"
                ) from exc
            mark_down(server, reason)
            raise ServerDownError(
                f"engine server {server.url} is down ({server.down}); request failed"
            ) from exc
        except asyncio.CancelledError:
            if self._closed:
                raise EngineServerError("SGLangEngine was closed before the request finished") from None
            if server.down is None:  # the caller gave up: free the server's slot too
                asyncio.get_running_loop().create_task(self._abort_quietly(server, payload["rid"]))
            raise
        finally:
            server.in_flight -= 1
            server.tasks.discard(task)
        if status == 200 and body:  # the hot path: no httpx.Response to build
            try:
                return orjson.loads(body)
            except orjson.JSONDecodeError:
                pass  # json_or_raise words the error
        response = httpx.Response(status, content=body)
        if status == 400:
            overflow = context_refusal(error_message(response), len(payload["input_ids"]), self.max_context)
            if overflow is not None:
                raise overflow
        return json_or_raise(response, server.url, "/generate")

    async def _answers_health(self, server: Server) -> bool:
        try:
            response = await self._client.get(f"{server.url}/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _abort_quietly(self, server: Server, server_rid: str) -> None:
        try:
            await self._client.post(f"{server.url}/abort_request", json={"rid": server_rid})
        except httpx.HTTPError:
            pass

    async def _post(self, server: Server, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self._client.post(f"{server.url}{path}", json=body)
        except httpx.TransportError as exc:
            mark_down(server, f"{transport_reason(exc)} on {path}")
            raise ServerDownError(f"engine server {server.url} is down ({server.down})") from exc
        data = json_or_raise(response, server.url, path)
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineServerError(
                f"{server.url}{path} failed: {data.get('message') or data.get('error_message')}"
            )
        return data

    async def _model_info(self, server: Server) -> dict[str, Any]:
        try:
            response = await self._client.get(f"{server.url}/model_info")
            if response.status_code == 404:  # sglang before /model_info existed
                response = await self._client.get(f"{server.url}/get_model_info")
        except httpx.TransportError as exc:
            mark_down(server, f"{transport_reason(exc)} on /model_info")
            raise ServerDownError(f"engine server {server.url} is down ({server.down})") from exc
        return json_or_raise(response, server.url, "/model_info")

    async def _gather_live(self, fn: Callable[[Server], Awaitable[Any]]) -> list[Any]:
        """Run `fn(server)` on every live server; raise the first error after all have finished.

        A server found dead on the way is only taken out (the others carry on without it), unless
        none is left."""
        live = self._pool.live()
        results = await asyncio.gather(*(fn(s) for s in live), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, ServerDownError)]
        if errors:
            raise errors[0]
        if not self._pool.live():
            raise self._pool.none_left()
        return [r for r in results if not isinstance(r, BaseException)]


def transport_reason(exc: httpx.TransportError) -> str:
    """What failed, named by the underlying error (aiohttp's ServerDisconnectedError, ...)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and body.get("error_message"):  # a LoRA route's LoRAUpdateOutput
        return str(body["error_message"])
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


# A server's words for a request over the model's context: SGLang's ("The input (N tokens) is
# longer than the model's context length (M tokens).", "Requested token count exceeds the model's
# maximum context length of M tokens. ...") and areal-nb engine-server's (SGLang's second).
_CONTEXT_REFUSAL = re.compile(r"(?:is longer than|exceeds) the model's (?:maximum )?context length")
_CONTEXT_LIMIT = re.compile(r"context length (?:of |\()(\d+) tokens")


def context_refusal(message: str, prompt_len: int, max_context: int | None) -> ContextLengthExceeded | None:
    """The overflow a server's 400 `message` to a `prompt_len`-token prompt stands for, or None
    (not a context refusal, no limit known, or a prompt that fits and asked too many new tokens)."""
    if not _CONTEXT_REFUSAL.search(message):
        return None
    limit = _CONTEXT_LIMIT.search(message)
    context = int(limit.group(1)) if limit else max_context
    if context is None or prompt_len < context:
        return None
    return ContextLengthExceeded(prompt_len, context, detail=f"the engine server refused it: {message}")


def json_or_raise(response: httpx.Response, url: str, path: str) -> Any:
    if response.status_code == 400:
        raise EngineRefused(f"engine server {url}{path} rejected the request: {error_message(response)}")
    if response.status_code != 200:
        raise EngineServerError(
            f"engine server {url}{path} answered {response.status_code}: {error_message(response)}"
        )
    if not response.content:
        return None
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise EngineServerError(
            f"engine server {url}{path} sent invalid JSON: {response.text[:200]!r}"
        ) from exc

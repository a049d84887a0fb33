"""`create_engine_app(engine, settings)`: an in-process engine behind SGLang's native HTTP API subset.

What `areal-nb engine-server` serves (CPU machines, CI, the cluster export's CPU path), and what the
`SGLangEngine` client is tested against. The semantics follow `docs/reference/sglang-api.md`:
- `/generate`: `input_ids` (one prompt or a batch), the closed `sampling_params` key set (an unknown
  key is a 400), `return_logprob`; the reply has `text`, `output_ids` and `meta_info` with
  `finish_reason` objects, `output_token_logprobs` triples, `weight_version` and per-token
  `weight_versions` spans, `prompt_tokens`, `completion_tokens`.
- `/pause_generation` (`abort`: in-flight requests return partial output with an abort reason;
  `retract` / `in_place`: they freeze and go on after `/continue_generation`, under the new weights
  if an update came in between); new `/generate` calls wait while paused.
- `/update_weights_from_disk`: when not paused it waits for in-flight generations and holds new ones
  back (sglang's writer lock); when paused it applies at once. Only directories under
  `settings.weights_dir` are read (resolved, so `..` and symlinks cannot leave it).
- LoRA (`settings.lora`, `--enable-lora`; `lora_serving.py`): `/load_lora_adapter`,
  `/unload_lora_adapter` and `lora_path` on `/generate`, with SGLang's replies and messages; one
  adapter (or the base) is in the engine at a time, and a request for another waits at the gate
  in `_ServingState.admit` until the running batch drains (first come, first served; a request
  waiting there is not reached by `/abort_request` until it enters). Adapter folders are read
  only under `settings.weights_dir`.
- `--api-key`: every route but `/health*` needs `Authorization: Bearer KEY` (401 otherwise).
Bad input is a 400 and disturbs nothing; our own faults are 500s with a logged traceback.
`/generate` is served by a plain ASGI route in front of the FastAPI app (`_GenerateRoute`): it is
called once per rollout request, on the thread that shares the GIL with the engine, and FastAPI's
per-request machinery was half of its CPU.

The engine is any object with LocalEngine's surface (`agenerate`, `abort`, `abort_all`, `pause`,
`resume`, `update_weights(path, version)`, `set_version`, `get_version`, `tokenizer`,
`max_context`, `eos_token_ids`); this module never loads a model itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from areal_nb.api import GenerationConfig, InvalidRequestError, ModelRequest, ModelResponse
from areal_nb.api.bounded_body import BodyOverLimit, BodyTimedOut, read_bounded_body
from areal_nb.api.client_gone import ClientGone, unless_client_leaves
from areal_nb.errors import BadRequest, BodyError, ContractViolation, HTTPError, render_error  # noqa: F401 (re-exported)

from .admission import DEFAULT_ADMISSION_MAX_WAIT, AdmissionWindow
from .defaults import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES
from .lora_serving import Adapter, AdapterServing, LoraError, LoraSettings
from .native_api import (
    AbortRequest,
    GenerateRequest,
    LoadLoraAdapterRequest,
    PauseRequest,
    SamplingParams,
    UnloadLoraAdapterRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightVersionRequest,
    lora_update_reply,
    unknown_field_message,
    unknown_sampling_keys,
)
from .sglang_wire import GenerateAnswer, finish_abort, finish_length, finish_stop, generate_answer
from .weights import read_weights_dir

logger = logging.getLogger(__name__)

_UNSUPPORTED_IF_SET = (
    "stop_regex",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)


@dataclass
class EngineServerSettings:
    model_path: str = ""
    served_model_name: str = ""
    api_key: str | None = None
    weights_dir: str | None = None  # the only tree /update_weights_from_disk may read
    # a burst reaching an idle engine starts as one batch (admission.py); 0 sends each at once.
    # An app made in code (tests, benchmarks) starts each request at once; `areal-nb engine-server`
    # passes DEFAULT_ADMISSION_GAP.
    admission_gap: float = 0.0
    admission_max_wait: float = DEFAULT_ADMISSION_MAX_WAIT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger bodies → 413 (defaults.py says why)
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # a body not complete this long after its headers → 408
    # LoRA adapters (`--enable-lora` and its flags; lora_serving.py); None: LoRA is not enabled
    lora: LoraSettings | None = None


class _APIKeyMiddleware:
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


class _GenerateRoute:
    """`/generate` as a plain ASGI app in front of FastAPI; every other path goes on to FastAPI.

    The same handler, validation and 400 bodies as a FastAPI route would give, without FastAPI's
    per-request machinery (its middleware stack, two AsyncExitStacks, dependency solving, the
    Request object): that was about half of the server's CPU per /generate, spent on the thread
    that shares the GIL with the engine. Bad input is a 400 (`_error_body`); an unexpected error
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
            await _send_json(send, 405, {"detail": "Method Not Allowed"}, [(b"allow", b"POST, PUT")])
            return
        try:
            content = await unless_client_leaves(self.handle(await self.read_body(scope, receive)), receive)
        except ClientGone:
            return  # nobody to answer; the generation was aborted (as sglang aborts a disconnected request)
        except BodyError as exc:
            await _send_json(
                send, exc.status, sglang_error(exc.status, str(exc)), [(b"connection", b"close")]
            )
            return
        except (BadRequest, ValidationError) as exc:
            await _send_json(send, 400, _error_body(exc))
            return
        except Exception:
            logger.exception("engine-server: /generate failed")
            await _send_json(send, 500, sglang_error(500, "Internal Server Error"))
            return
        await _send_json(send, 200, content)


async def _read_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
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


async def _send_json(send: Send, status: int, content: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:
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


def _error_body(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, ValidationError):
        exc = ContractViolation(_validation_message(exc))
    return render_error(exc, "sglang").body


class _ServingState:
    """Pause gate, sglang's model-update lock and the in-flight rids, all on the server's loop;
    with LoRA also the adapter gate: one adapter (or the base) in the engine at a time, first
    come, first served (lora_serving.py)."""

    def __init__(self, engine: Any, adapters: AdapterServing | None = None) -> None:
        self.engine = engine
        self.adapters = adapters
        self.cond = asyncio.Condition()
        self.paused = False
        self.updating = False
        self.in_flight: dict[str, int] = {}  # rid → 1 (a dict keeps insertion order for prefix aborts)
        self.held: dict[str, int] = {}  # rids waiting in the admission window, not yet in the engine
        self.aborted_while_held: set[str] = set()  # they answer "abort" without reaching the engine
        self._tickets = itertools.count()
        self.waiting: dict[int, Adapter | None] = {}  # arrival ticket → adapter, while at the gate
        self._notifying: set[asyncio.Task] = set()

    async def admit(self, rids: list[str], adapter: Adapter | None = None) -> None:
        if self.adapters is None:
            async with self.cond:
                await self.cond.wait_for(lambda: not self.paused and not self.updating)
                self._enter(rids)
            return
        ticket = next(self._tickets)
        self.waiting[ticket] = adapter
        entered = False
        try:
            while True:
                async with self.cond:
                    await self.cond.wait_for(lambda: self._may_enter(adapter, ticket))
                    if adapter is self.adapters.applied:
                        self._enter(rids)
                        entered = True
                        return
                    self.updating = True  # the switch: nothing in flight, nobody enters meanwhile
                try:
                    await asyncio.to_thread(self.adapters.switch, adapter)
                finally:
                    async with self.cond:
                        self.updating = False
                        self.cond.notify_all()
        finally:
            del self.waiting[ticket]
            if not entered:  # the requests behind this one may go now
                task = asyncio.get_running_loop().create_task(self.notify())
                self._notifying.add(task)  # (a task nobody holds may be collected before it runs)
                task.add_done_callback(self._notifying.discard)

    def _may_enter(self, adapter: Adapter | None, ticket: int) -> bool:
        if self.paused or self.updating:
            return False
        applied = self.adapters.applied if self.adapters is not None else None
        if adapter is applied:  # unless an earlier request waits for another adapter
            return not any(t < ticket and a is not applied for t, a in self.waiting.items())
        return not self.in_flight and ticket == min(self.waiting)

    def _enter(self, rids: list[str]) -> None:
        duplicates = [r for r in rids if r in self.in_flight or rids.count(r) > 1]
        if duplicates:
            raise BadRequest(f"Duplicate request ID detected: {duplicates[0]!r}")
        for rid in rids:
            self.in_flight[rid] = 1

    async def notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def drop_use(self, adapter: Adapter) -> None:
        async with self.cond:
            assert self.adapters is not None
            self.adapters.uses[adapter] -= 1
            if self.adapters.uses[adapter] <= 0:
                del self.adapters.uses[adapter]
            self.cond.notify_all()

    async def exclusive(self, work: Callable[[], Any]) -> Any:
        """`work()` in a thread while no weight update, adapter load or switch runs."""
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.updating = True
        try:
            return await asyncio.to_thread(work)
        finally:
            async with self.cond:
                self.updating = False
                self.cond.notify_all()

    async def release(self, rid: str) -> None:
        async with self.cond:
            self.in_flight.pop(rid, None)
            self.cond.notify_all()

    async def wait_idle(self) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: not self.in_flight)


@dataclass
class _EngineApp:
    """Everything the routes share, kept on the FastAPI app as `app.state.engine_app`."""

    engine: Any
    settings: EngineServerSettings
    serving: _ServingState
    window: AdmissionWindow
    weights_root: Path | None


def create_engine_app(engine: Any, settings: EngineServerSettings | None = None) -> ASGIApp:
    settings = settings or EngineServerSettings()
    adapters = None
    if settings.lora is not None:
        adapters = AdapterServing(engine, settings.lora)  # loads --lora-paths (trusted: the command line)
    serving = _ServingState(engine, adapters)
    window = AdmissionWindow(
        settings.admission_gap, settings.admission_max_wait, lambda: bool(serving.in_flight)
    )
    weights_root = Path(settings.weights_dir).resolve() if settings.weights_dir else None
    # FastAPI's native OpenTelemetry hook asks the global tracer/meter/logger providers on every
    # request whether one is configured (a few environment lookups each): no use to us, and it
    # ran on the thread that shares the GIL with the engine.
    app = FastAPI(
        title="areal-nb engine-server",
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    shared = _EngineApp(engine, settings, serving, window, weights_root)
    app.state.engine_app = shared
    app.add_exception_handler(BadRequest, _bad_request)
    app.add_exception_handler(ValidationError, _bad_request)
    app.add_exception_handler(BodyError, _body_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(Exception, _internal_error)
    app.add_api_route("/abort_request", abort_request, methods=["POST"])
    app.add_api_route("/pause_generation", pause_generation, methods=["POST"])
    app.add_api_route("/continue_generation", continue_generation, methods=["POST"])
    app.add_api_route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"])
    app.add_api_route("/update_weight_version", update_weight_version, methods=["POST"])
    app.add_api_route("/load_lora_adapter", load_lora_adapter, methods=["POST"])
    app.add_api_route("/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
    app.add_api_route("/model_info", model_info, methods=["GET"])
    app.add_api_route("/get_model_info", model_info, methods=["GET"])
    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health_generate", health, methods=["GET"])

    served: ASGIApp = _GenerateRoute(
        app, functools.partial(generate, shared), functools.partial(_read_request_body, shared)
    )
    if settings.api_key:  # outermost: /generate is checked too
        served = _APIKeyMiddleware(served, settings.api_key)
    return served


# -------------------------------------------------------------------- error handlers


async def _bad_request(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_error_body(exc), status_code=400)


async def _body_error(_request: Request, exc: BodyError) -> JSONResponse:
    return JSONResponse(
        sglang_error(exc.status, str(exc)), status_code=exc.status, headers={"connection": "close"}
    )


async def _client_gone(_request: Request, _exc: ClientGone) -> JSONResponse:
    # an answer nobody reads (the client left mid-body), without an error log
    return JSONResponse(
        sglang_error(400, "the client disconnected before sending the whole body"),
        status_code=400,
        headers={"connection": "close"},
    )


async def _internal_error(_request: Request, _exc: Exception) -> JSONResponse:
    # Starlette re-raises the exception after this answer, so the server (uvicorn) logs its
    # traceback; the client gets no detail. Nothing else changes: the routes release their locks
    # in `finally`, and the next request is served as before.
    return JSONResponse(sglang_error(500, "Internal Server Error"), status_code=500)


def _shared(request: Request) -> _EngineApp:
    return request.app.state.engine_app


async def _read_request_body(shared: _EngineApp, scope: Scope, receive: Receive) -> bytes:
    return await _read_body(scope, receive, shared.settings.max_body_bytes, shared.settings.body_timeout)


async def _body_of(request: Request) -> dict[str, Any]:
    return _parse_body(await _read_request_body(_shared(request), request.scope, request.receive))


# -------------------------------------------------------------------- generation


async def generate(shared: _EngineApp, raw: bytes) -> Any:
    """`POST|PUT /generate` (served by `_GenerateRoute`): the reply, or a single prompt's reply."""
    engine, state = shared.engine, shared.serving
    body = GenerateRequest.model_validate(_parse_body(raw))
    items = _plan_generate(body, engine)
    rids = [item.rid for item in items]
    for rid in rids:
        state.held[rid] = 1
    try:
        await (
            shared.window.wait()
        )  # before admit: a request held here is not in flight, so pause never waits on it
    finally:
        for rid in rids:
            state.held.pop(rid, None)
        aborted = {rid for rid in rids if rid in state.aborted_while_held}
        state.aborted_while_held -= aborted
    adapter = await _resolve_adapter(shared, body.lora_path, len(items))
    try:
        await state.admit(rids, adapter)
    except BaseException:
        if adapter is not None:
            await state.drop_use(adapter)
        raise
    try:
        outputs = await asyncio.gather(
            *(_run_one(engine, item, item.rid in aborted) for item in items), return_exceptions=True
        )
    finally:
        if adapter is not None:
            await state.drop_use(adapter)
        for rid in rids:
            await state.release(rid)
    for out in outputs:
        if isinstance(out, ValueError):
            raise BadRequest(str(out))
        if isinstance(out, BaseException):
            raise out
    replies = [_reply(engine, item, out, state) for item, out in zip(items, outputs, strict=True)]
    return replies if body.input_ids and isinstance(body.input_ids[0], list) else replies[0]


async def abort_request(request: Request):
    shared = _shared(request)
    engine, state = shared.engine, shared.serving
    body = AbortRequest.model_validate(await _body_of(request))
    if body.abort_all:
        state.aborted_while_held.update(state.held)
        engine.abort_all()
    else:
        if body.rid in state.held:  # sglang's scheduler matches by prefix: "req-1" also aborts "req-10"
            state.aborted_while_held.update(r for r in state.held if r.startswith(body.rid))
        if body.rid in state.in_flight:
            for rid in [r for r in state.in_flight if r.startswith(body.rid)]:
                engine.abort(rid)
    return JSONResponse(None)


async def _resolve_adapter(shared: _EngineApp, lora_path: Any, n: int) -> Adapter | None:
    """The adapter a /generate call names (counted as in use until the call ends), with SGLang's
    errors: LoRA not enabled, a name never loaded. A name loaded once and unloaded since is loaded
    again from its folder, as SGLang does."""
    names = [p for p in _per_item(lora_path, n, "lora_path") if p]
    if not names:
        return None
    adapters = shared.serving.adapters
    if adapters is None:
        raise BadRequest(
            f"LoRA adapter '{names[0]}' was requested, but LoRA is not enabled. Please launch the server "
            "with --enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint."
        )
    if len(set(names)) > 1 or len(names) < n:
        raise BadRequest(
            "areal-nb engine-server serves one LoRA adapter (or the base) per /generate call: "
            "send the prompts of each adapter in their own call"
        )
    name = names[0]
    if name not in adapters.loaded:
        if name not in adapters.ever_loaded:
            raise BadRequest(adapters.unknown(name))
        try:
            await shared.serving.exclusive(functools.partial(_load_unless_loaded, adapters, name))
        except LoraError as exc:
            raise BadRequest(f"Failed to implicitly load LoRA adapter {name}: {exc}") from None
    adapter = adapters.loaded[name]
    adapters.uses[adapter] += 1
    return adapter


def _load_unless_loaded(adapters: AdapterServing, name: str) -> None:
    if name not in adapters.loaded:  # (another request may have reloaded it meanwhile)
        adapters.load(name, adapters.ever_loaded[name])


async def load_lora_adapter(request: Request):
    """`POST /load_lora_adapter`: SGLang's `LoRAUpdateOutput`, 200 on success, else 400."""
    shared = _shared(request)
    body = LoadLoraAdapterRequest.model_validate(await _body_of(request))
    adapters = shared.serving.adapters
    if adapters is None:
        return _lora_reply(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", None)
    try:
        path = _allowed_weights_path(body.lora_path, shared.weights_root)
    except BadRequest as exc:
        return _lora_reply(False, str(exc), adapters.loaded_adapters())
    try:
        await shared.serving.exclusive(functools.partial(adapters.load, body.lora_name, path))
    except LoraError as exc:
        return _lora_reply(False, str(exc), adapters.loaded_adapters())
    return _lora_reply(True, "", adapters.loaded_adapters())


async def unload_lora_adapter(request: Request):
    """`POST /unload_lora_adapter`: new requests can no longer name the adapter at once; the
    answer comes when the requests that named it are done (SGLang's order)."""
    shared = _shared(request)
    state = shared.serving
    body = UnloadLoraAdapterRequest.model_validate(await _body_of(request))
    if state.adapters is None:
        return _lora_reply(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", None)
    adapters = state.adapters
    try:
        adapter = adapters.unregister(body.lora_name)
    except LoraError as exc:
        return _lora_reply(False, str(exc), None)
    async with state.cond:
        await state.cond.wait_for(lambda: adapters.uses[adapter] <= 0)
    return _lora_reply(True, "", adapters.loaded_adapters())


def _lora_reply(success: bool, message: str, loaded: dict[str, str] | None) -> JSONResponse:
    return JSONResponse(lora_update_reply(success, message, loaded), status_code=200 if success else 400)


# -------------------------------------------------------------------- pause, weights


async def pause_generation(request: Request):
    shared = _shared(request)
    state = shared.serving
    body = PauseRequest.model_validate(await _body_of(request))
    async with state.cond:
        state.paused = True
    await asyncio.to_thread(shared.engine.pause)  # retract / in_place: rows freeze with their state
    if body.mode == "abort":
        shared.engine.abort_all()
        await state.wait_idle()  # sglang returns once nothing holds the model lock
    return {"message": "Generation paused successfully.", "status": "ok"}


async def continue_generation(request: Request):
    shared = _shared(request)
    state = shared.serving
    await _body_of(request)
    async with state.cond:
        state.paused = False
        state.cond.notify_all()
    shared.engine.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


async def update_weights_from_disk(request: Request):
    shared = _shared(request)
    engine, state = shared.engine, shared.serving
    body = UpdateWeightsFromDiskRequest.model_validate(await _body_of(request))
    try:
        version = _int_version(body.weight_version) if body.weight_version is not None else None
        path = _allowed_weights_path(body.model_path, shared.weights_root)
    except BadRequest as exc:
        return JSONResponse(
            {"success": False, "message": str(exc), "num_paused_requests": 0}, status_code=400
        )
    if body.abort_all_requests:
        engine.abort_all()
    async with state.cond:
        locked = not state.paused  # paused: no lock, apply at once (sglang)
        if locked:
            await state.cond.wait_for(lambda: not state.updating)
            state.updating = True
    try:
        if locked:
            await state.wait_idle()
        if state.adapters is None:
            await asyncio.to_thread(engine.update_weights, str(path), version)
        else:  # the new base, with the adapter the engine serves put back on top
            adapters = state.adapters
            await asyncio.to_thread(
                lambda: adapters.update_base(
                    read_weights_dir(path), lambda weights: engine.update_weights(weights, version)
                )
            )
    except ValueError as exc:
        return JSONResponse(
            {"success": False, "message": str(exc), "num_paused_requests": 0}, status_code=400
        )
    finally:
        if locked:
            async with state.cond:
                state.updating = False
                state.cond.notify_all()
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    return {"success": True, "message": message, "num_paused_requests": 0}


async def update_weight_version(request: Request):
    engine = _shared(request).engine
    body = UpdateWeightVersionRequest.model_validate(await _body_of(request))
    version = _int_version(body.new_version)
    if body.abort_all_requests:
        engine.abort_all()
    engine.set_version(version)
    return {"success": True, "message": f"Weight version updated to {version}.", "new_version": str(version)}


# -------------------------------------------------------------------- info


def model_info(request: Request) -> dict[str, Any]:
    shared = _shared(request)
    settings = shared.settings
    return {
        "model_path": settings.model_path,
        "served_model_name": settings.served_model_name or settings.model_path,
        "tokenizer_path": settings.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": str(shared.engine.get_version()),
        "load_format": "auto",
    }


async def server_info(request: Request):
    shared = _shared(request)
    # sglang puts per-DP scheduler state under internal_states; ours is the engine's counters
    stats = getattr(shared.engine, "stats", None)
    internal = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else {}
    return {
        "model_path": shared.settings.model_path,
        "version": "areal-nb",
        "internal_states": [internal],
        "admission": {"windows": shared.window.windows, "held": shared.window.held},
        "paused": shared.serving.paused,
    }


async def health():
    return JSONResponse(None)


# -------------------------------------------------------------------- helpers


@dataclass
class _Item:
    rid: str
    request: ModelRequest
    sampling: SamplingParams
    return_logprob: bool


def _parse_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


_TYPE_ERRORS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "string_type": "a string",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}
# the names pydantic puts in an error's location for the branch of a union it tried
_UNION_BRANCHES = {"str", "int", "float", "bool", "dict", "list", "none"}


def _validation_message(exc: ValidationError) -> str:
    """Each wrong field once, named, in serde's words where it is a wrong JSON type (as SGLang's
    decoder says it): `sampling_params.max_new_tokens: invalid type: floating point `4.0`, expected an integer`."""
    seen: dict[str, str] = {}
    for e in exc.errors():
        field = ".".join(
            str(p)
            for p in e["loc"]
            if isinstance(p, int) or ("[" not in p and "-" not in p and p not in _UNION_BRANCHES)
        )
        field = field or "body"
        if field in seen:
            continue
        if e["type"] in _TYPE_ERRORS:
            seen[field] = (
                f"{field}: invalid type: {_unexpected(e.get('input'))}, expected {_TYPE_ERRORS[e['type']]}"
            )
        elif e["type"] == "extra_forbidden":
            seen[field] = f"unknown field `{field.rsplit('.', 1)[-1]}`"
        else:
            seen[field] = f"{field}: {e['msg']}"
    return "; ".join(seen.values())


def _unexpected(value: Any) -> str:
    """A JSON value as serde's `Unexpected` shows it (shortened)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value[:40]}"' + ("..." if len(value) > 40 else "")
    return (
        "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else type(value).__name__
    )


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def _plan_generate(body: GenerateRequest, engine: Any) -> list[_Item]:
    if body.text is not None or body.input_embeds is not None:
        raise BadRequest("areal-nb engine-server takes input_ids only (apply the chat template client-side)")
    if body.input_ids is None:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if body.stream:
        raise BadRequest("areal-nb engine-server does not stream; send stream=false")
    batch = body.input_ids if body.input_ids and isinstance(body.input_ids[0], list) else [body.input_ids]
    n = len(batch)
    if isinstance(body.rid, str) and n > 1:
        rids = [f"{body.rid}_{i}" for i in range(n)]
    elif body.rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    else:
        rids = _per_item(body.rid, n, "rid")
    params = _per_item(body.sampling_params or {}, n, "sampling_params")
    return_logprob = _per_item(body.return_logprob, n, "return_logprob")
    if any(_per_item(body.top_logprobs_num, n, "top_logprobs_num")):
        raise BadRequest(
            "areal-nb engine-server returns the sampled tokens' log-probs only (top_logprobs_num=0)"
        )
    for start in _per_item(body.logprob_start_len, n, "logprob_start_len"):
        if start != -1:
            raise BadRequest("areal-nb engine-server returns output log-probs only (logprob_start_len=-1)")
    items = []
    for ids, rid, raw, want_logprob in zip(batch, rids, params, return_logprob, strict=True):
        if not ids:
            raise BadRequest("input_ids cannot be empty.")
        sampling = _sampling_params(raw)
        gconfig = _generation_config(sampling, len(ids), engine)
        items.append(
            _Item(rid, ModelRequest(input_ids=list(ids), gconfig=gconfig, rid=rid), sampling, want_logprob)
        )
    return items


def _sampling_params(raw: Any) -> SamplingParams:
    if not isinstance(raw, dict):
        raise ContractViolation("sampling_params must be an object")
    unknown = unknown_sampling_keys(raw)
    if unknown:
        raise ContractViolation(unknown_field_message(unknown[0]))
    try:
        return SamplingParams.model_validate(raw)
    except ValidationError as exc:
        raise ContractViolation(_validation_message(exc)) from None


def _generation_config(sp: SamplingParams, prompt_len: int, engine: Any) -> GenerationConfig:
    """sglang's sampling semantics → our GenerationConfig; what the engine cannot honour is a 400."""
    for key in _UNSUPPORTED_IF_SET:
        if getattr(sp, key) is not None:
            raise BadRequest(f"sampling_params.{key} is not supported by areal-nb engine-server")
    if sp.n != 1:
        raise BadRequest("sampling_params.n must be 1: send n separate requests")
    if sp.min_p or sp.presence_penalty or sp.repetition_penalty != 1.0:
        raise BadRequest(
            "min_p, presence_penalty and repetition_penalty are not supported by areal-nb engine-server"
        )
    max_new = 128 if sp.max_new_tokens is None else sp.max_new_tokens
    context = getattr(engine, "max_context", None)
    if context is not None and prompt_len + max_new > context:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} tokens: "
            f"{prompt_len} prompt tokens + max_new_tokens={max_new}"
        )
    greedy = 0 <= sp.temperature < 1e-6  # sglang: below 1e-6 is greedy
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop
    config = GenerationConfig(
        max_new_tokens=max_new,
        min_new_tokens=sp.min_new_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        stop_token_ids=list(sp.stop_token_ids or []),
        stop=stop or None,
        ignore_eos=sp.ignore_eos,
        skip_special_tokens=sp.skip_special_tokens,
        frequency_penalty=sp.frequency_penalty,
    )
    try:  # the sampling ranges, checked once here at the door; the engine trusts a checked config
        return config.check()
    except InvalidRequestError as exc:
        raise BadRequest(str(exc)) from None


async def _run_one(engine: Any, item: _Item, aborted: bool = False) -> ModelResponse:
    if aborted:  # aborted before it reached the engine (as sglang's waiting queue): nothing generated
        return ModelResponse(input_tokens=list(item.request.input_ids), stop_reason="abort")
    try:
        return await engine.agenerate(item.request)
    except asyncio.CancelledError:
        engine.abort(item.rid)
        raise


def _reply(engine: Any, item: _Item, out: ModelResponse, state: _ServingState) -> GenerateAnswer:
    sp, tokenizer = item.sampling, engine.tokenizer
    finish, text_end = _finish_reason(engine, item, out)
    text = ""
    if tokenizer is not None:
        text = tokenizer.decode(
            out.output_tokens[:text_end] if not sp.no_stop_trim else out.output_tokens,
            skip_special_tokens=sp.skip_special_tokens,
        )
        if finish.get("type") == "stop" and isinstance(finish.get("matched"), str) and not sp.no_stop_trim:
            text = text[: text.find(finish["matched"])] if finish["matched"] in text else text
    return generate_answer(
        rid=item.rid,
        text=text,
        prompt_tokens=len(out.input_tokens),
        output_ids=list(out.output_tokens),
        logprobs=list(out.output_logprobs) if item.return_logprob else None,
        finish=finish,
        versions=list(out.output_versions),
        version_now=engine.get_version(),
        latency=out.latency,
    )


def _finish_reason(engine: Any, item: _Item, out: ModelResponse) -> tuple[dict[str, Any], int]:
    """sglang's finish_reason object, and where the text ends if the stop token is trimmed."""
    n = len(out.output_tokens)
    if out.stop_reason == "abort":
        return finish_abort(), n
    if out.stop_reason == "length":
        return finish_length(item.request.gconfig.max_new_tokens), n
    g = item.request.gconfig
    stop_ids = set(g.stop_token_ids) | (set() if g.ignore_eos else set(engine.eos_token_ids))
    if out.output_tokens and out.output_tokens[-1] in stop_ids:
        return finish_stop(out.output_tokens[-1]), n - 1
    text = engine.tokenizer.decode(out.output_tokens, skip_special_tokens=False) if engine.tokenizer else ""
    return finish_stop(next((s for s in (g.stop or []) if s in text), None)), n


def _int_version(version: str) -> int:
    try:
        value = int(version)
    except (TypeError, ValueError):
        raise BadRequest(
            f"weight_version must be an integer string for areal-nb engine-server, got {version!r}"
        ) from None
    if value < 0:  # -1 marks prompt tokens in the exported versions; a policy version is >= 0
        raise BadRequest(f"weight_version must be >= 0, got {value}")
    return value


def _allowed_weights_path(model_path: str, root: Path | None) -> Path:
    """The resolved directory, if it and every weight file in it lie under `root`. A path the file
    system cannot take (a NUL byte, a name too long, a symlink loop, no permission) is the
    client's error, named."""
    if root is None:
        raise BadRequest("this server was started without --weights-dir: it loads no weights from disk")
    shown = model_path if len(model_path) <= 200 else f"{model_path[:200]}... ({len(model_path)} characters)"
    try:
        path = Path(model_path)
        if not path.is_absolute():
            path = root / path
        resolved = path.resolve()
        if not resolved.is_relative_to(root):
            raise BadRequest(f"model_path {shown!r} is outside the allowed weights directory {str(root)!r}")
        if not resolved.is_dir():
            raise BadRequest(f"model_path {shown!r} is not a directory under {str(root)!r}")
        for entry in resolved.iterdir():
            if not entry.resolve().is_relative_to(root):  # a symlinked weight file pointing elsewhere
                raise BadRequest(f"{entry.name!r} in {shown!r} links outside the allowed weights directory")
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Path.resolve)
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(
            f"model_path {shown!r} cannot be used: {type(exc).__name__}: {_short(exc)}"
        ) from None
    return resolved


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."

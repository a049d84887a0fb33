"""The engine-server's routes: `/generate` (called by `asgi.GenerateRoute`), abort, pause and
continue, weight and version updates, LoRA adapters, and the info routes. Each route reads its
body, checks it (`translate.py`), passes the gate (`gate.py`) and calls the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope

from areal_nb.api import ModelResponse
from areal_nb.errors import BadRequest

from ..admission import AdmissionWindow
from ..lora_serving import Adapter, AdapterServing, LoraError
from ..native_api import (
    AbortRequest,
    GenerateRequest,
    LoadLoraAdapterRequest,
    PauseRequest,
    UnloadLoraAdapterRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightVersionRequest,
    lora_update_reply,
)
from ..weights import read_weights_dir
from .asgi import read_body
from .gate import ServingState
from .settings import EngineServerSettings
from .translate import Item, allowed_weights_path, int_version, parse_body, per_item, plan_generate, reply


@dataclass
class EngineApp:
    """Everything the routes share, kept on the FastAPI app as `app.state.engine_app`."""

    engine: Any
    settings: EngineServerSettings
    serving: ServingState
    window: AdmissionWindow
    weights_root: Path | None


def shared_of(request: Request) -> EngineApp:
    return request.app.state.engine_app


async def read_request_body(shared: EngineApp, scope: Scope, receive: Receive) -> bytes:
    return await read_body(scope, receive, shared.settings.max_body_bytes, shared.settings.body_timeout)


async def body_of(request: Request) -> dict[str, Any]:
    return parse_body(await read_request_body(shared_of(request), request.scope, request.receive))


# -------------------------------------------------------------------- generation


async def generate(shared: EngineApp, raw: bytes) -> Any:
    """`POST|PUT /generate` (served by `GenerateRoute`): the reply, or a single prompt's reply."""
    engine, state = shared.engine, shared.serving
    body = GenerateRequest.model_validate(parse_body(raw))
    items = plan_generate(body, engine)
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
    responses: list[ModelResponse] = []
    for out in outputs:
        if isinstance(out, ValueError):
            raise BadRequest(str(out))
        if isinstance(out, BaseException):
            raise out
        responses.append(out)
    replies = [reply(engine, item, out) for item, out in zip(items, responses, strict=True)]
    return replies if body.input_ids and isinstance(body.input_ids[0], list) else replies[0]


async def _run_one(engine: Any, item: Item, aborted: bool = False) -> ModelResponse:
    if aborted:  # aborted before it reached the engine (as sglang's waiting queue): nothing generated
        return ModelResponse(input_tokens=list(item.request.input_ids), stop_reason="abort")
    try:
        return await engine.agenerate(item.request)
    except asyncio.CancelledError:
        engine.abort(item.rid)
        raise


async def abort_request(request: Request):
    shared = shared_of(request)
    engine, state = shared.engine, shared.serving
    body = AbortRequest.model_validate(await body_of(request))
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


async def _resolve_adapter(shared: EngineApp, lora_path: Any, n: int) -> Adapter | None:
    """The adapter a /generate call names (counted as in use until the call ends), with SGLang's
    errors: LoRA not enabled, a name never loaded. A name loaded once and unloaded since is loaded
    again from its folder, as SGLang does."""
    names = [p for p in per_item(lora_path, n, "lora_path") if p]
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
    shared = shared_of(request)
    body = LoadLoraAdapterRequest.model_validate(await body_of(request))
    adapters = shared.serving.adapters
    if adapters is None:
        return _lora_reply(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", None)
    try:
        path = allowed_weights_path(body.lora_path, shared.weights_root)
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
    shared = shared_of(request)
    state = shared.serving
    body = UnloadLoraAdapterRequest.model_validate(await body_of(request))
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
    shared = shared_of(request)
    state = shared.serving
    body = PauseRequest.model_validate(await body_of(request))
    async with state.cond:
        state.paused = True
    await asyncio.to_thread(shared.engine.pause)  # retract / in_place: rows freeze with their state
    if body.mode == "abort":
        shared.engine.abort_all()
        await state.wait_idle()  # sglang returns once nothing holds the model lock
    return {"message": "Generation paused successfully.", "status": "ok"}


async def continue_generation(request: Request):
    shared = shared_of(request)
    state = shared.serving
    await body_of(request)
    async with state.cond:
        state.paused = False
        state.cond.notify_all()
    shared.engine.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


async def update_weights_from_disk(request: Request):
    shared = shared_of(request)
    engine, state = shared.engine, shared.serving
    body = UpdateWeightsFromDiskRequest.model_validate(await body_of(request))
    try:
        version = int_version(body.weight_version) if body.weight_version is not None else None
        path = allowed_weights_path(body.model_path, shared.weights_root)
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
    engine = shared_of(request).engine
    body = UpdateWeightVersionRequest.model_validate(await body_of(request))
    version = int_version(body.new_version)
    if body.abort_all_requests:
        engine.abort_all()
    engine.set_version(version)
    return {"success": True, "message": f"Weight version updated to {version}.", "new_version": str(version)}


# -------------------------------------------------------------------- info


def model_info(request: Request) -> dict[str, Any]:
    shared = shared_of(request)
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
    shared = shared_of(request)
    # sglang puts per-DP scheduler state under internal_states; ours is the engine's counters
    stats = shared.engine.stats
    internal = {}
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        internal = dataclasses.asdict(stats)
    return {
        "model_path": shared.settings.model_path,
        "version": "areal-nb",
        "internal_states": [internal],
        "admission": {"windows": shared.window.windows, "held": shared.window.held},
        "paused": shared.serving.paused,
    }


async def health():
    return JSONResponse(None)

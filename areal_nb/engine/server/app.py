"""`create_engine_app(engine, settings)`: the engine-server's ASGI app, put together.

FastAPI serves the control and info routes (`routes.py`) with SGLang's error bodies; `/generate`
is a plain ASGI route in front of it (`asgi.GenerateRoute`), and the key check, when a key is set,
is outermost so that `/generate` is checked too.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp

from areal_nb.errors import BadRequest, BodyError
from areal_nb.serving import ClientGone

from ..admission import AdmissionWindow
from ..lora_serving import AdapterServing
from . import routes
from .asgi import APIKeyMiddleware, GenerateRoute, error_body, sglang_error
from .gate import ServingState
from .routes import EngineApp, read_request_body
from .settings import EngineServerSettings


def create_engine_app(engine: Any, settings: EngineServerSettings | None = None) -> ASGIApp:
    settings = settings or EngineServerSettings()
    adapters = None
    if settings.lora is not None:
        adapters = AdapterServing(engine, settings.lora)  # loads --lora-paths (trusted: the command line)
    serving = ServingState(engine, adapters)
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
    shared = EngineApp(engine, settings, serving, window, weights_root)
    app.state.engine_app = shared
    app.add_exception_handler(BadRequest, _bad_request)
    app.add_exception_handler(ValidationError, _bad_request)
    app.add_exception_handler(BodyError, _body_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(Exception, _internal_error)
    for name in (  # SGLang's control routes: each path names its handler
        "abort_request",
        "pause_generation",
        "continue_generation",
        "update_weights_from_disk",
        "update_weight_version",
        "load_lora_adapter",
        "unload_lora_adapter",
    ):
        app.add_api_route(f"/{name}", getattr(routes, name), methods=["POST"])
    for path, route in (
        ("/model_info", routes.model_info),
        ("/get_model_info", routes.model_info),
        ("/server_info", routes.server_info),
        ("/health", routes.health),
        ("/health_generate", routes.health),
    ):
        app.add_api_route(path, route, methods=["GET"])

    served: ASGIApp = GenerateRoute(
        app, functools.partial(routes.generate, shared), functools.partial(read_request_body, shared)
    )
    if settings.api_key:  # outermost: /generate is checked too
        served = APIKeyMiddleware(served, settings.api_key)
    return served


# -------------------------------------------------------------------- error handlers


# (Starlette types a handler's exception as Exception; each is registered for the type it narrows to)


async def _bad_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, (BadRequest, ValidationError))
    return JSONResponse(error_body(exc), status_code=400)


async def _body_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyError)
    return JSONResponse(
        sglang_error(exc.status, str(exc)), status_code=exc.status, headers={"connection": "close"}
    )


async def _client_gone(_request: Request, _exc: Exception) -> JSONResponse:
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

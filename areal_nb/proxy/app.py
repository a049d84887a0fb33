"""`create_app(engine, tokenizer, settings)`: the proxy as a FastAPI app.

The routes are module-level handlers on routers, one module per kind: `info_routes.py` (health,
models), `session_routes.py` (start, end, rewards, export), `generation_routes.py` (the doors),
`counting_routes.py` (count tokens, tokenize). Everything an app serves lives on its `app.state`: the
sessions (`proxy`, a `ProxyState`), `engine`, `tokenizer`, the capture layer's `completion`
settings and the body limit. Build as many apps per process as you like. Endpoints, keys and
status codes follow AReaL's (docs/reference/areal-semantics.md, "The proxy"), with these
deliberate differences:

- every OpenAI route also exists without `/v1` (SDKs differ in where `/v1` goes);
- `/export_trajectories` waits for `end_session` at most `export_wait_timeout` seconds
  (504 after that; the session stays exportable), never forever;
- chat calls after `/rl/end_session` answer 409 "session ended": the episode is closed, so
  nothing more is recorded into it (rewards may still be set until export);
- keys of exported or expired sessions answer 410 (not 401), so a late agent call says why;
- unknown body fields are ignored, except that `chat_template_kwargs` at the top level (where
  the OpenAI SDK merges `extra_body`) is forwarded, not dropped;
- errors are OpenAI-style JSON everywhere except `/v1/messages` (Anthropic style);
- only `InvalidRequestError` (input validation in the capture layer and the engine) becomes a
  400; any other exception is our fault: 500 with a logged traceback. The body is checked
  before any route parses it (`limits.py`: size, JSON depth, lone surrogates), and the limits
  that follow from the model's context before the template is rendered (docs/guides/limits.md);
- an export removes its session only once the response was sent: a failed, cancelled or
  abandoned export leaves the session exportable with the same result.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException

from areal_nb.api import InferenceEngine
from areal_nb.capture.cache import InteractionCache
from areal_nb.capture.request_limits import context_tokens, max_chars_per_token
from areal_nb.capture.settings import CompletionSettings
from areal_nb.errors import HTTPError
from areal_nb.serving import bearer_token_of

from . import counting_routes, generation_routes, info_routes, session_routes
from .dependencies import check_open, logger
from .errors import describe_validation_errors, error_response, http_error_response
from .generation_routes import chat_completion_response, text_completion_response
from .limits import THREAD_BYTES, BodyLimitMiddleware, body_limit, body_problem
from .schemas import ChatCompletionRequest, CompletionRequest
from .settings import ProxySettings
from .state import ProxyState

# A route of `app.state.direct_routes`: `await route(path, body, headers)` answers a request the
# way the app would, or returns None when only the full ASGI stack can (see `_direct_route`).
_DirectRoute = Callable[[str, bytes, Mapping[str, str]], Awaitable["Response | None"]]


def create_app(engine: InferenceEngine, tokenizer: Any, settings: ProxySettings | None = None) -> FastAPI:
    """A proxy app serving `engine` (any `InferenceEngine`) through `tokenizer`'s chat template."""
    settings = settings or ProxySettings()
    app = FastAPI(title="areal_nb proxy", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.proxy = ProxyState(settings, InteractionCache)
    app.state.settings = settings
    app.state.engine = engine
    app.state.tokenizer = tokenizer
    app.state.completion = settings.completion if settings.completion is not None else CompletionSettings()
    context = context_tokens(engine, None)
    max_body = body_limit(
        settings.max_body_bytes, context, max_chars_per_token(tokenizer) if context else None
    )
    app.state.max_body_bytes = max_body
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body, body_timeout=settings.body_timeout)

    app.add_exception_handler(HTTPError, _http_error_of_ours)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for routes in (info_routes, session_routes, generation_routes, counting_routes):
        app.include_router(routes.router)
    app.state.direct_routes = {
        f"{prefix}{path}": functools.partial(_direct_route, schema, respond, app.state)
        for prefix in ("/v1", "")
        for path, schema, respond in (
            ("/chat/completions", ChatCompletionRequest, chat_completion_response),
            ("/completions", CompletionRequest, text_completion_response),
        )
    }
    return app


# ---------------------------------------------------------------------- error dialects
# (Starlette types a handler's exception as Exception; each is registered for the type it narrows to)


async def _http_error_of_ours(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPError)
    return http_error_response(request.url.path, exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(request.url.path, 422, describe_validation_errors(exc.errors()), "validation_error")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    response = error_response(request.url.path, exc.status_code, str(exc.detail), None)
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


# ---------------------------------------------------------------------- the direct lane
async def _direct_route(
    schema: type[ChatCompletionRequest] | type[CompletionRequest],
    respond: Callable[..., Awaitable[Response]],
    state: State,
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
) -> Response | None:
    """A generating route (`/v1/chat/completions`, `/v1/completions`) for callers in this
    process (`proxy.inprocess`), without the ASGI stack: the same body checks, model, key check
    and handler as the route, so the same answer, at a fifth of the cost per call (middleware,
    routing and dependency solving were most of what an in-process call cost). Whatever is
    unusual — a body the middleware or the model would refuse, a non-JSON content type, a large
    body — returns None before anything happened, and the caller sends the request through the
    full stack, which answers it: the lane never has to reproduce an error it did not raise
    itself. `create_app` binds `schema`, `respond` (the route's handler) and `state` (the app's),
    giving a `_DirectRoute`."""
    content_type = headers.get("content-type")
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None
    if not raw or len(raw) > min(state.max_body_bytes, THREAD_BYTES) or body_problem(raw) is not None:
        return None
    try:
        body = schema.model_validate(json.loads(raw))
    except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
        return None
    try:
        return await respond(state, body, check_open(state.proxy.session_for_key(bearer_token_of(headers))))
    except HTTPError as exc:
        return http_error_response(path, exc)
    except Exception:  # what Starlette's ServerErrorMiddleware answers (and logs) for a bug
        logger.exception("%s failed", path)
        return PlainTextResponse("Internal Server Error", status_code=500)

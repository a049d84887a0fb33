"""What the proxy's routes share: the caller's session from its key, and `generate`.

The key dependencies (`admin`, `session_key`, `OpenSession`) turn a request's key into what a
route may act on, with the proxy's 401/403/409/410 answers; `generate` awaits a capture-layer
call and turns its failures into the proxy's 400/408/500 answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from starlette.datastructures import State

from areal_nb.capture.generate import CompletionBackend
from areal_nb.errors import HTTPError
from areal_nb.serving import ClientGone, bearer_token_of, unless_client_leaves

from .errors import ProxyError
from .logs import RepeatFilter
from .state import SessionData

# One logger for every route, under the name the proxy has always logged as (log configs and
# the repeat filter's counts see one source).
logger = logging.getLogger("areal_nb.proxy.app")
logger.addFilter(RepeatFilter())  # one traceback per kind of failure per 10 s, not per request

T = TypeVar("T")


# ---------------------------------------------------------------------- auth dependencies
# async on purpose: FastAPI runs plain-def dependencies in a thread pool (two thread hops per
# call), and these never block.
def _bearer_token(request: Request) -> str | None:
    """The key from `Authorization: Bearer <t>` or, for the Anthropic SDK, `x-api-key`."""
    return bearer_token_of(request.headers)


async def admin(request: Request) -> None:
    request.app.state.proxy.check_admin(_bearer_token(request))


async def session_key(request: Request) -> SessionData:
    return request.app.state.proxy.session_for_key(_bearer_token(request))


KeyedSession = Annotated[SessionData, Depends(session_key)]  # the session the caller's key names


async def _open_session(session: KeyedSession) -> SessionData:
    return check_open(session)


OpenSession = Annotated[SessionData, Depends(_open_session)]  # ... that has not ended (409 otherwise)


def check_open(session: SessionData) -> SessionData:
    if session.ended:
        raise ProxyError(
            409,
            f"session {session.session_id!r} has ended (/rl/end_session was called); "
            "no more calls are recorded into it",
            "session_ended",
        )
    return session


# ---------------------------------------------------------------------- calling the capture layer
async def generate(call: Awaitable[T], request: Request | None = None) -> T:
    """Await a capture-layer call, turning its failures into clear HTTP errors; with `request`,
    the call is cancelled if the client goes away first (`unless_client_leaves`)."""
    try:
        return await (call if request is None else unless_client_leaves(call, request.receive))
    except ClientGone:  # nobody is left to read this answer
        raise ProxyError(
            408, "the client went away before the reply was ready; nothing was recorded", "client_gone"
        ) from None
    except HTTPError:  # input errors (InvalidRequestError: 400 invalid_request) and our own answers
        raise
    except Exception as exc:  # our own or the engine's fault: 500 with a traceback, keep serving
        logger.exception("generation failed")
        raise ProxyError(500, f"generation failed: {type(exc).__name__}: {exc}", "generation_failed") from exc


def capture_kwargs(state: State, session: SessionData) -> dict[str, Any]:
    """What every capture-layer call takes from the app and the session."""
    return {
        "engine": state.engine,
        "tokenizer": state.tokenizer,
        "settings": state.completion,
        "cache": session.cache,
    }


def capture_backend(state: State, session: SessionData) -> CompletionBackend:
    """`capture_kwargs` as the `CompletionBackend` a capture-layer call runs on."""
    return CompletionBackend(**capture_kwargs(state, session))

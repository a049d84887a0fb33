"""The proxy's session routes: the admin's (capacity, start a session, export it) and the agent
side's (end its session, set rewards).

An export removes its session only once the response was sent (`_HandOver`): a failed,
cancelled or abandoned export leaves the session exportable with the same result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from areal_nb.api import InvalidRequestError

from .dependencies import KeyedSession, admin, logger
from .errors import ProxyError
from .export import discounted_calls
from .schemas import (
    ExportTrajectoriesRequest,
    GrantCapacityRequest,
    SetRewardRequest,
    StartSessionRequest,
    StartSessionResponse,
)
from .state import ProxyState, SessionData

router = APIRouter()


# ---------------------------------------------------------------------- admin endpoints
@router.post("/grant_capacity", dependencies=[Depends(admin)])
async def grant_capacity(request: Request, body: GrantCapacityRequest | None = None) -> dict[str, int]:
    return {"capacity": request.app.state.proxy.grant_capacity(body.count if body is not None else 1)}


@router.post("/rl/start_session", dependencies=[Depends(admin)], response_model=StartSessionResponse)
async def start_session(body: StartSessionRequest, request: Request) -> StartSessionResponse:
    session = request.app.state.proxy.start_session(body.task_id, body.api_key)
    return StartSessionResponse(session_id=session.session_id, api_key=session.api_key)


@router.post("/export_trajectories", dependencies=[Depends(admin)])
async def export_trajectories(body: ExportTrajectoriesRequest, request: Request) -> Response:
    """One-shot export. The session is removed only once its data was handed to the client:
    a failed, cancelled or abandoned export leaves it exportable, with the same result."""
    state: ProxyState = request.app.state.proxy
    session = state.get_session(body.session_id)
    timeout = (
        body.wait_timeout if body.wait_timeout is not None else request.app.state.settings.export_wait_timeout
    )
    if not await session.wait_ended(timeout, gave_up=request.is_disconnected):
        if await request.is_disconnected():
            raise ProxyError(
                408, "the client went away while the export waited; the session is kept", "client_gone"
            )
        raise ProxyError(
            504,
            f"session {body.session_id!r} did not end within {timeout:g} s: the agent side must call "
            "/rl/end_session before its trajectories can be exported (the session is kept; retry)",
            "export_timeout",
        )
    while not state.claim_export(session):  # another export holds it: wait for its outcome
        if await request.is_disconnected():
            raise ProxyError(
                408, "the client went away while the export waited; the session is kept", "client_gone"
            )
        await asyncio.sleep(0.02)

    def give_back() -> None:  # the export did not reach anyone: keep the session exportable
        session.cache.undo_reward_discount()
        state.release_export(session)

    work = asyncio.ensure_future(asyncio.to_thread(_export_json, session, body))
    try:
        payload = await asyncio.shield(work)
    except asyncio.CancelledError:  # the thread runs on: give the session back once it is done
        work.add_done_callback(lambda _: give_back())
        raise
    except InvalidRequestError as exc:
        give_back()
        raise ProxyError(400, f"cannot export session {body.session_id!r}: {exc}", "export_failed") from exc
    except Exception as exc:
        give_back()
        logger.exception("export of session %r failed", body.session_id)
        raise ProxyError(
            500, f"export failed: {type(exc).__name__}: {exc} (the session is kept)", "export_failed"
        ) from exc
    if await request.is_disconnected():
        give_back()
        raise ProxyError(
            408, "the client went away before the export was sent; the session is kept", "client_gone"
        )
    return _HandOver(
        payload, on_sent=lambda: state.remove_session(session, "was exported"), on_failed=give_back
    )


def _export_json(session: SessionData, body: ExportTrajectoriesRequest) -> bytes:
    interactions = discounted_calls(session, body.discount, body.style, body.discount_mode)
    wire = {iid: interaction.to_wire() for iid, interaction in interactions.items()}
    return json.dumps(
        {"session_id": session.session_id, "interactions": wire}, ensure_ascii=False, allow_nan=False
    ).encode()


# ---------------------------------------------------------------------- session endpoints
@router.post("/rl/end_session")
async def end_session(request: Request, session: KeyedSession) -> dict[str, Any]:
    count = request.app.state.proxy.end_session(session)
    return {"message": "success", "session_id": session.session_id, "interaction_count": count}


@router.post("/rl/set_reward")
async def set_reward(body: SetRewardRequest, session: KeyedSession) -> dict[str, Any]:
    cache = session.cache
    if body.agent is not None and body.interaction_id is not None:
        raise ProxyError(400, "set_reward takes interaction_id or agent, not both", "invalid_request")
    if body.agent is not None:
        session.set_agent_reward(body.agent, body.reward)
    elif body.interaction_id is None:
        session.set_last_reward(body.reward)
    else:
        try:
            cache.set_reward(body.interaction_id, body.reward)
        except KeyError:
            raise ProxyError(
                400,
                f"interaction {body.interaction_id!r} not found in session {session.session_id!r}",
                "unknown_interaction",
            ) from None
    return {"message": "success"}


class _HandOver(Response):
    """A JSON response that reports whether it was sent (export hands a session over)."""

    media_type = "application/json"

    def __init__(self, content: bytes, *, on_sent: Callable[[], Any], on_failed: Callable[[], Any]) -> None:
        super().__init__(content)
        self._on_sent, self._on_failed = on_sent, on_failed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            self._on_failed()
            raise
        self._on_sent()

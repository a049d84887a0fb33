"""The proxy's public info routes: `/health` and the OpenAI model list and cards (no key needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from areal_nb.capture.request_limits import context_tokens

from .model_cards import model_card, model_list
from .state import ProxyState

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    state: ProxyState = request.app.state.proxy
    return {
        "status": "ok",
        "initialized": True,
        "active_sessions": len(state.sessions),
        "capacity": state.capacity,
    }


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def models(request: Request) -> dict[str, Any]:
    state = request.app.state
    return model_list(
        state.settings.model_name, context_tokens(state.engine, state.completion.engine_max_tokens)
    )


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def model(model_id: str, request: Request) -> dict[str, Any]:
    """Any name: a request's `model` names the agent that calls, and every name is served."""
    state = request.app.state
    return model_card(model_id, context_tokens(state.engine, state.completion.engine_max_tokens))

"""Lossless JSON-safe wire format for interactions (used between the proxy and its client)."""

from __future__ import annotations

from typing import Any

from areal_nb.api import ModelResponse
from areal_nb.errors import ExportError

from .interaction import InteractionWithTokenLogpReward, TokenRow

_WIRE_VERSION = 1
_ROW_KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids")


def _stop_ids(mr: ModelResponse) -> list[int]:
    try:
        return sorted(mr._stop_ids())
    except ValueError:
        return []


def interaction_to_wire(it: InteractionWithTokenLogpReward) -> dict[str, Any]:
    mr = it.model_response
    data: dict[str, Any] = {
        "wire_version": _WIRE_VERSION,
        "interaction_id": it.interaction_id,
        "parent_id": it.parent_id,
        "reward": it.reward,
        "raw_reward": it.raw_reward,
        "messages": it.messages,
        "output_message_list": it.output_message_list,
        "chat_template_type": it.chat_template_type,
        "tools": it.tools,
        "agent": it.agent,
        "created_at": it.created_at,
        "model_response": None,
        "completion": it.completion.model_dump(mode="json") if it.completion is not None else None,
        "response": it.response.model_dump(mode="json") if it.response is not None else None,
        "tensor_dict": None,
    }
    if mr is not None:
        data["model_response"] = {
            "input_tokens": list(mr.input_tokens),
            "output_tokens": list(mr.output_tokens),
            "output_logprobs": [float(x) for x in mr.output_logprobs],
            "output_versions": [int(v) for v in mr.output_versions],
            "stop_reason": mr.stop_reason,
            "eos_token_ids": _stop_ids(mr),
        }
    if it.has_tensor_data:
        row = it.token_row()
        data["tensor_dict"] = {k: list(getattr(row, k)) for k in _ROW_KEYS}
        data["tensor_dict"]["rewards"] = [it.reward if it.reward is not None else 0.0]
        data["tensor_dict"]["turn_returns"] = it.turn_returns()
    return data


def interaction_from_wire(
    cls: type[InteractionWithTokenLogpReward],
    data: dict[str, Any],
    parents: dict[str, InteractionWithTokenLogpReward],
) -> InteractionWithTokenLogpReward:
    from openai.types.responses import Response

    if data.get("wire_version") != _WIRE_VERSION:
        raise ExportError(f"unsupported interaction wire version {data.get('wire_version')!r}")
    mr_data = data.get("model_response")
    mr = ModelResponse(**mr_data) if mr_data is not None else None
    parent_id = data.get("parent_id")
    parent = parents.get(parent_id) if parent_id is not None else None
    it = cls(
        model_response=mr,
        reward=data.get("reward"),
        raw_reward=data.get("raw_reward"),
        parent=parent,
        chat_template_type=data["chat_template_type"],
        messages=data.get("messages") or [],
        output_message_list=data.get("output_message_list"),
        completion=_completion_from_wire(data.get("completion")),
        response=Response.model_validate(data["response"]) if data.get("response") else None,
        tools=data.get("tools"),
        agent=data.get("agent"),
        _interaction_id=data.get("interaction_id"),
        created_at=data.get("created_at", 0.0),
    )
    if parent_id is not None and parent is None:
        it._wire_parent_id = parent_id
        if data.get("tensor_dict") is not None:
            it._frozen_row = TokenRow(**{k: list(data["tensor_dict"][k]) for k in _ROW_KEYS})
            it._frozen_turn_returns = data["tensor_dict"].get("turn_returns")
    return it


def _completion_from_wire(data: dict[str, Any] | None) -> Any:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    if not data:
        return None
    if data.get("object") == "text_completion":  # built leniently, as it was (echoed None log-probs)
        return Completion.construct(**data)
    return ChatCompletion.model_validate(data)


def interactions_to_wire(interactions: dict[str, InteractionWithTokenLogpReward]) -> dict[str, Any]:
    """An exported dict plus every ancestor of its members, parents first.

    `interactions_from_wire` rebuilds the same dict with the same parent links.
    """
    ordered: list[InteractionWithTokenLogpReward] = []
    seen: set[int] = set()

    def visit(it: InteractionWithTokenLogpReward) -> None:
        if id(it) in seen:
            return
        if it.parent is not None:
            visit(it.parent)
        seen.add(id(it))
        ordered.append(it)

    for it in interactions.values():
        visit(it)
    return {"interactions": [it.to_wire() for it in ordered], "exported": list(interactions)}


def interactions_from_wire(payload: dict[str, Any]) -> dict[str, InteractionWithTokenLogpReward]:
    rebuilt: dict[str, InteractionWithTokenLogpReward] = {}
    for item in payload["interactions"]:
        it = InteractionWithTokenLogpReward.from_wire(item, rebuilt)
        assert it.interaction_id is not None, "only complete interactions (with an id) are exported"
        rebuilt[it.interaction_id] = it
    return {key: rebuilt[key] for key in payload["exported"]}

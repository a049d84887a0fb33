"""What `GET /v1/models` and `GET /v1/models/{id}` say about the served model: one card that
OpenAI's, vLLM's and Anthropic's clients each read their own fields of.

Agent harnesses size their context budget (when to compact, when to stop) from the model card:
vLLM's `max_model_len`, `context_length` (OpenRouter, LM Studio), `context_window` and
`max_context_length` (read by `verifiers` among others), Anthropic's `max_input_tokens` and
`max_tokens`. The proxy's context is the engine's (or `engine_max_tokens` when smaller); the
most prompt tokens leave room for one output token, and no request may ask for more output
tokens than the context. Without a known context these fields are left out, not guessed.
"""

from __future__ import annotations

from typing import Any

# Anthropic's `created_at` is a required RFC 3339 date; the release date is unknown (its epoch)
_EPOCH = "1970-01-01T00:00:00Z"


def model_card(model_id: str, context: int | None) -> dict[str, Any]:
    """The card of `model_id`, served with a context of `context` tokens (None: unknown)."""
    card: dict[str, Any] = {
        "id": model_id,
        "object": "model",  # OpenAI
        "created": 0,
        "owned_by": "areal_nb",
        "root": model_id,  # vLLM
        "parent": None,
        "type": "model",  # Anthropic
        "display_name": model_id,
        "created_at": _EPOCH,
        "lifecycle": "active",
    }
    if context is not None:
        card |= {
            "max_model_len": context,
            "context_length": context,
            "context_window": context,
            "max_context_length": context,
            "max_input_tokens": context - 1,
            "max_tokens": context,
        }
    return card


def model_list(model_id: str, context: int | None) -> dict[str, Any]:
    """The list page: OpenAI's `{"object": "list", "data"}` and Anthropic's paging fields."""
    return {
        "object": "list",
        "data": [model_card(model_id, context)],
        "has_more": False,
        "first_id": model_id,
        "last_id": model_id,
    }

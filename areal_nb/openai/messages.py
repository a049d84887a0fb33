"""Normalising chat messages so that equal conversations compare equal as plain dicts.

Parent links are found by comparing message lists (not tokens, see the semantics digest
§2.1), so an SDK object and its `model_dump()` must normalise to the same dict: pydantic
models are dumped with `exclude_none=True` and `None`-valued keys are dropped everywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel


class CompletionRequestError(ValueError):
    """An invalid request: the proxy answers it with HTTP 400 and `str(error)`."""


class MessageTypeError(CompletionRequestError, TypeError):
    """Messages of the wrong type (a `TypeError` that is also a `CompletionRequestError`)."""


def _drop_none(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _drop_none(value.model_dump(exclude_none=True))
    if isinstance(value, Mapping):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_drop_none(v) for v in value]
    return copy.deepcopy(value)


def normalize_message(message: Any, index: int = 0) -> dict[str, Any]:
    """One message as a plain dict without `None` values (SDK objects are dumped)."""
    if isinstance(message, BaseModel):
        return _drop_none(message)
    if isinstance(message, Mapping):
        return _drop_none(message)
    raise MessageTypeError(
        f"messages[{index}] must be a dict or an OpenAI message object, "
        f"got {type(message).__name__}: {message!r:.80}"
    )


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate and normalise a chat `messages` argument into a new list of plain dicts."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise MessageTypeError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not isinstance(messages, list):
        raise MessageTypeError(
            f"messages must be a list, got {type(messages).__name__}; pass list(messages)"
        )
    if not messages:
        raise CompletionRequestError("messages cannot be empty")
    return [normalize_message(m, i) for i, m in enumerate(messages)]


def is_prefix(prefix: list[dict[str, Any]], full: list[dict[str, Any]]) -> bool:
    return len(prefix) <= len(full) and all(a == b for a, b in zip(prefix, full, strict=False))

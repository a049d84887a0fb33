"""Normalising chat messages so that equal conversations compare equal as plain dicts.

Parent links are found by comparing message lists (not tokens: docs/reference/areal-semantics.md,
"Parent links"), so an SDK object and its `model_dump()` must normalise to the same dict: pydantic
models are dumped with `exclude_none=True` and `None`-valued keys are dropped everywhere.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from areal_nb.errors import CompletionRequestError, MessageTypeError  # noqa: F401 (re-exported)

_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


# What `copy.deepcopy` returns unchanged (immutable): skipping its dispatch for every string of
# every message was a fifth of a short chat completion's own CPU.
_ATOMIC = frozenset({str, int, float, bool, bytes, type(None)})


def _drop_none(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is dict:
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
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
        raise MessageTypeError(f"messages must be a list, got {type(messages).__name__}; pass list(messages)")
    if not messages:
        raise CompletionRequestError("messages cannot be empty")
    return [normalize_message(m, i) for i, m in enumerate(messages)]


def is_prefix(prefix: list[dict[str, Any]], full: list[dict[str, Any]]) -> bool:
    """Whether `full` starts with the messages of `prefix` (equal, or `_same_message`)."""
    return len(prefix) <= len(full) and all(
        a == b or _same_message(a, b) for a, b in zip(prefix, full, strict=False)
    )


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages say the same thing, however the client spelled them.

    SDKs and agent frameworks echo an assistant message back in their own shape: the OpenAI
    Agents SDK leaves out the `content` of a tool-call message (we returned `""`), a streaming
    client keeps each tool call's `index`, another re-serialises the arguments (`{"a":1}` for
    `{"a": 1}`) or sends text as a list of text parts. Parent links compare messages, so
    without this those calls lost their parent (and, in a tree discount, their reward).
    An edited text or a different call still differs.
    """
    return _link_form(a) == _link_form(b)


def _link_form(message: dict[str, Any]) -> dict[str, Any]:
    # an empty list or object says nothing (`"annotations": []`, `"tool_calls": []`)
    out = {k: v for k, v in message.items() if not (isinstance(v, list | dict) and not v)}
    content = out.get("content")
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        content = "".join(p if isinstance(p, str) else p["text"] for p in content)
    if content in (None, "", []):
        out.pop("content", None)
    else:
        out["content"] = content
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_call_link_form(c) for c in calls]
    return out


def _is_text_part(part: Any) -> bool:
    return isinstance(part, str) or (
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _call_link_form(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    out = {k: v for k, v in call.items() if k != "index" and not (k == "type" and v == "function")}
    fn = out.get("function")
    if isinstance(fn, Mapping):
        fn = dict(fn)
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            try:
                fn["arguments"] = json.loads(arguments)
            except ValueError:
                pass
        out["function"] = fn
    return out


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` appended to the leading system (or developer) message after a blank
    line; a system message of `text` is put first where there is none or its content is not plain
    text. How a template that cannot show something (a schema, tools) is told it anyway."""
    first = messages[0] if messages else None
    if (
        first is not None
        and first.get("role") in ("system", "developer")
        and isinstance(first.get("content"), str)
    ):
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def check_chat_messages(messages: list[dict[str, Any]]) -> None:
    """Reject message shapes a chat template cannot render, naming the offending field.

    Run on every path (chat, Responses items, Anthropic) after conversion, so a template never
    sees a role, part or tool call it would fail on (or render wrongly).
    """
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if not isinstance(role, str) or role not in _CHAT_ROLES:
            raise CompletionRequestError(
                f"{where}.role must be one of {sorted(_CHAT_ROLES)}, got {role!r:.80}"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise CompletionRequestError(f"{where}.content must be a string or a list of parts")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, Mapping):
                raise CompletionRequestError(
                    f"{where}.content[{j}] must be an object, got {type(part).__name__}"
                )
            kind = part.get("type")
            if kind != "text":  # the template would drop it: the prompt would lose what was sent
                raise CompletionRequestError(
                    f"{where}.content[{j}].type must be 'text', got {kind!r:.80}: the engine reads text only"
                )
            if not isinstance(part.get("text"), str):
                raise CompletionRequestError(f"{where}.content[{j}].text must be a string")
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise CompletionRequestError(f"{where}.{key} must be a string")
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if role != "assistant" or not isinstance(calls, list):
            raise CompletionRequestError(f"{where}.tool_calls must be a list and only on assistant messages")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise CompletionRequestError(
                    f"{where}.tool_calls[{j}] must be an object with function.name (a non-empty string)"
                )
            if not isinstance(fn.get("arguments", ""), str | Mapping):
                raise CompletionRequestError(
                    f"{where}.tool_calls[{j}].function.arguments must be a JSON string or an object"
                )

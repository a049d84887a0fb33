"""Anthropic Messages ⇄ OpenAI chat conversion, so `/v1/messages` runs the chat-completion path.

Anthropic traffic is recorded as chat-completion interactions. The conversion is exact both
ways for what a tiny agent loop needs (unlike AReaL's, which flattens content to text, nothing but
thinking blocks is dropped):

- request → chat: `system` becomes a leading system message; text blocks join into one
  string; `tool_use` blocks become the assistant's `tool_calls`; `tool_result` blocks become
  `role: "tool"` messages (placed before the user's remaining text, which is the order the
  Anthropic API defines); images become `image_url` parts.
- ChatCompletion → Anthropic `Message` dict: text block (when the text is non-empty), one
  `tool_use` block per tool call, `stop_reason`, usage. The message id is the completion id,
  so `message.id` is the interaction id for `/rl/set_reward`.
- An assistant message echoed back by the agent converts to the same chat dict the
  completion recorded (text unchanged; tool arguments restored verbatim through
  `tool_arguments`), so parent links survive the round trip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

from areal_nb.errors import AnthropicRequestError  # noqa: F401 (re-exported)

# OpenAI finish_reason → Anthropic stop_reason
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "abort": "end_turn",
    "content_filter": "refusal",
}

_IGNORED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _text_of(content: Any, where: str) -> str:
    """Plain text of a string or a list of text blocks (tool_result / system content)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise AnthropicRequestError(f"{where} must be a string or a list of text blocks")
    parts: list[str] = []
    for i, block in enumerate(content):
        if isinstance(block, str):
            parts.append(block)
            continue
        if not isinstance(block, Mapping) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise AnthropicRequestError(f"{where}[{i}]: only text blocks are supported here, got {kind!r}")
        parts.append(_require_str(block, "text", f"{where}[{i}]"))
    return "\n".join(parts)


def _require_str(block: Mapping[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise AnthropicRequestError(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise AnthropicRequestError(f"{where}.source must be an object")
    if source.get("type") == "base64":
        media = _require_str(source, "media_type", f"{where}.source")
        data = _require_str(source, "data", f"{where}.source")
        url = f"data:{media};base64,{data}"
    elif source.get("type") == "url":
        url = _require_str(source, "url", f"{where}.source")
    else:
        raise AnthropicRequestError(
            f"{where}.source.type must be 'base64' or 'url', got {source.get('type')!r}"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_call(block: Mapping[str, Any], where: str, tool_arguments: Mapping[str, str]) -> dict[str, Any]:
    call_id = _require_str(block, "id", where)
    name = _require_str(block, "name", where)
    tool_input = block.get("input", {})
    if not isinstance(tool_input, Mapping):
        raise AnthropicRequestError(f"{where}.input must be an object")
    arguments = tool_arguments.get(call_id)
    # Reuse the model's own argument string when it encodes the same object, so the echoed
    # assistant message equals the recorded one and the parent link holds.
    if arguments is None or _loads_or_none(arguments) != dict(tool_input):
        arguments = json.dumps(tool_input, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# One pass over the blocks, in order, since their order decides the chat messages' order
# (tool results before the user's text); long because each block kind is checked where met.
def _convert_message(message: Any, index: int, tool_arguments: Mapping[str, str]) -> list[dict[str, Any]]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise AnthropicRequestError(f"{where} must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise AnthropicRequestError(f"{where}.role must be 'user' or 'assistant', got {role!r}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise AnthropicRequestError(f"{where}.content must be a string or a list of content blocks")

    texts: list[str] = []
    images: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    tool_messages: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        bwhere = f"{where}.content[{j}]"
        if isinstance(block, str):
            texts.append(block)
            continue
        if not isinstance(block, Mapping):
            raise AnthropicRequestError(f"{bwhere} must be an object, got {type(block).__name__}")
        kind = block.get("type")
        if not isinstance(kind, str):
            raise AnthropicRequestError(f"{bwhere}.type must be a string, got {type(kind).__name__}")
        if kind == "text":
            texts.append(_require_str(block, "text", bwhere))
        elif kind == "image":
            images.append(_image_part(block, bwhere))
        elif kind == "tool_use":
            if role != "assistant":
                raise AnthropicRequestError(f"{bwhere}: tool_use blocks belong to assistant messages")
            tool_calls.append(_tool_call(block, bwhere, tool_arguments))
        elif kind == "tool_result":
            if role != "user":
                raise AnthropicRequestError(f"{bwhere}: tool_result blocks belong to user messages")
            tool_messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _require_str(block, "tool_use_id", bwhere),
                    "content": _text_of(block.get("content"), f"{bwhere}.content"),
                }
            )
        elif kind in _IGNORED_BLOCKS:
            continue  # the chat form has no place for them; our own outputs never contain them
        else:
            raise AnthropicRequestError(f"{bwhere}: unsupported content block type {kind!r}")

    out = list(tool_messages)
    if role == "assistant":
        # Assistant text blocks are pieces of one reply: join without separators so the
        # text we returned comes back unchanged.
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        out.append(msg)
    elif images:
        parts = [{"type": "text", "text": t} for t in texts] + images
        out.append({"role": "user", "content": parts})
    elif texts or not tool_messages:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _convert_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise AnthropicRequestError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise AnthropicRequestError(f"tools[{i}] must be an object")
        if tool.get("type") not in (None, "custom"):
            raise AnthropicRequestError(
                f"tools[{i}]: server tool type {tool.get('type')!r} is not supported; use custom tools"
            )
        name = _require_str(tool, "name", f"tools[{i}]")
        schema = tool.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(schema, Mapping):
            raise AnthropicRequestError(f"tools[{i}].input_schema must be an object")
        # name, description, parameters: the order an OpenAI client sends, so the same tool renders
        # the same prompt text through every door (the template dumps the tool's JSON as it is)
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = dict(schema)
        out.append({"type": "function", "function": function})
    return out or None


def _convert_tool_choice(choice: Any) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    if not isinstance(choice, Mapping):
        raise AnthropicRequestError("tool_choice must be an object like {'type': 'auto'}")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": _require_str(choice, "name", "tool_choice")}}
    raise AnthropicRequestError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}")


def _convert_output_format(config: Any) -> dict[str, Any] | None:
    """`output_config.format` (Anthropic's structured outputs: a text reply of JSON matching a
    schema) as the chat `response_format` that asks for the same."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise AnthropicRequestError("output_config must be an object like {'format': {...}}")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise AnthropicRequestError(
            f"output_config.format must be {{'type': 'json_schema', 'schema': {{...}}}}, got {fmt!r:.80}"
        )
    if not isinstance(fmt.get("schema"), Mapping):
        raise AnthropicRequestError("output_config.format needs a 'schema' object")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": dict(fmt["schema"])}}


def anthropic_request_to_chat(
    body: Mapping[str, Any], tool_arguments: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Keyword arguments for `create_chat_completion` from a Messages request body.

    `tool_arguments` maps tool-call ids the proxy returned to their exact argument strings.
    Unknown fields (metadata, thinking, service_tier, ...) are ignored.
    """
    if not isinstance(body, Mapping):
        raise AnthropicRequestError("the request body must be a JSON object")
    arguments = tool_arguments or {}
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise AnthropicRequestError("messages must be a non-empty list")

    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        system_text = _text_of(system, "system")
        if system_text:
            messages.append({"role": "system", "content": system_text})
    for i, message in enumerate(raw_messages):
        messages.extend(_convert_message(message, i, arguments))

    kwargs: dict[str, Any] = {"messages": messages}
    tools = _convert_tools(body.get("tools"))
    if tools is not None:
        kwargs["tools"] = tools
        tool_choice = _convert_tool_choice(body.get("tool_choice"))
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
    response_format = _convert_output_format(body.get("output_config"))
    if response_format is not None:
        kwargs["response_format"] = response_format
    if body.get("max_tokens") is not None:
        kwargs["max_completion_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            kwargs[key] = body[key]
    if body.get("stop_sequences"):
        kwargs["stop"] = list(body["stop_sequences"])
    return kwargs


def chat_completion_to_anthropic(completion: ChatCompletion, model: str) -> dict[str, Any]:
    """An Anthropic `Message` (as a JSON-ready dict) for a chat completion."""
    choice = completion.choices[0]
    content: list[dict[str, Any]] = []
    text = choice.message.content or ""
    if text:
        content.append({"type": "text", "text": text})
    for call in _function_calls(choice.message):
        parsed = _loads_or_none(call.function.arguments)
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.function.name,
                # Anthropic requires an object; a non-object argument string is kept under one key
                "input": parsed if isinstance(parsed, dict) else {"arguments": call.function.arguments},
            }
        )
    usage = completion.usage
    matched = getattr(choice, "stop_reason", None)  # the stop string that ended the reply, if one did
    matched = matched if isinstance(matched, str) and choice.finish_reason == "stop" else None
    return {
        "id": completion.id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "stop_sequence"
        if matched is not None
        else _STOP_REASONS.get(choice.finish_reason or "stop", "end_turn"),
        "stop_sequence": matched,
        "usage": {
            "input_tokens": usage.prompt_tokens if usage else 0,
            "output_tokens": usage.completion_tokens if usage else 0,
        },
    }


def tool_arguments_of(completion: ChatCompletion) -> dict[str, str]:
    """`{tool_call_id: arguments}` of a completion, for exact echo conversion later."""
    return {call.id: call.function.arguments for call in _function_calls(completion.choices[0].message)}


def _function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's tool calls; the proxy's completions only ever hold function calls."""
    calls = message.tool_calls or []
    for call in calls:
        assert isinstance(call, ChatCompletionMessageFunctionToolCall), f"not a function call: {call!r:.80}"
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]


def anthropic_stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Anthropic streaming event sequence (name, data) that reproduces `message`.

    message_start → (content_block_start, content_block_delta, content_block_stop) per block
    → message_delta (stop_reason, output usage) → message_stop.
    """
    start_message = dict(message)
    start_message["content"] = []
    start_message["stop_reason"] = None
    start_message["stop_sequence"] = None
    start_message["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start_message})
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            start_block: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start_block = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start_block},
            )
        )
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def format_sse(events: list[tuple[str, dict[str, Any]]]) -> str:
    """Server-sent-event text for named events (`event: NAME` / `data: JSON`)."""
    return "".join(
        f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n" for name, data in events
    )

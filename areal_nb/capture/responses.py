"""OpenAI Responses API on top of the chat-completion logic
(docs/reference/areal-semantics.md, "Responses API").

Input items are converted to chat messages for the chat template. The interaction's
`output_message_list` holds the output items converted the same way, so a next call that echoes
`response.output` back as input links to this call as its parent. Differences from AReaL: the
text parts of one input message stay one message (joined by a newline), and `function_call`
items become an assistant message with `tool_calls`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from areal_nb.api import InferenceEngine, ModelResponse, OutputConstraint

from .cache import InteractionCache
from .generate import (
    MODEL_NAME,
    CompletionBackend,
    agent_name,
    chat_template_kwargs_of,
    cut_stop_string,
    decode_output,
    generate_for_messages,
)
from .messages import CompletionRequestError, MessageTypeError, normalize_message
from .settings import CompletionSettings, SamplingRequest
from .structured import (
    constraint_of_format,
    constraint_of_guided,
    constraint_of_tool_choice,
    request_constraint,
)
from .tool_calls import THINK_CLOSE, THINK_OPEN, ParsedToolCall, parse_tool_calls
from .tool_specs import check_tools

_TEXT_PART_TYPES = ("input_text", "output_text", "text")
_ITEM_ROLES = ("user", "assistant", "system", "developer")


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CompletionRequestError(f"input[{index}].content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise CompletionRequestError(
                f"input[{index}].content[{j}] must be an object, got {type(part).__name__}"
            )
        if part.get("type") not in _TEXT_PART_TYPES:
            raise CompletionRequestError(
                f"input[{index}].content[{j}] has unsupported type {part.get('type')!r}; only text parts are supported"
            )
        text = part.get("text", "")
        if not isinstance(text, str):
            raise CompletionRequestError(f"input[{index}].content[{j}].text must be a string")
        texts.append(text)
    return "\n".join(texts)


def response_items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input/output items (normalised dicts) as chat messages."""
    messages: list[dict[str, Any]] = []
    previous_type: str | None = None
    for i, item in enumerate(items):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            if item.get("role") not in _ITEM_ROLES:
                raise CompletionRequestError(
                    f"input[{i}].role must be one of {list(_ITEM_ROLES)}, got {item.get('role')!r:.80}"
                )
            messages.append({"role": item["role"], "content": _content_text(item.get("content", ""), i)})
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not name:
                raise CompletionRequestError(
                    f"input[{i}] is a function_call without a name (a non-empty string)"
                )
            if not isinstance(arguments, str):
                raise CompletionRequestError(f"input[{i}].arguments must be a JSON string")
            _require_call_id(item, i)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if (
                last is not None
                and last["role"] == "assistant"
                and previous_type in ("message", "function_call")
            ):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            _require_call_id(item, i)
            messages.append(
                {
                    "role": "tool",
                    "content": output if isinstance(output, str) else _content_text(output, i),
                    "tool_call_id": item.get("call_id"),
                }
            )
        else:
            raise CompletionRequestError(f"input[{i}] has unsupported item type {kind!r}")
        previous_type = kind
    return messages


def _require_call_id(item: dict[str, Any], index: int) -> None:
    """A call and its output are paired by `call_id`; without one the template cannot pair them."""
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise CompletionRequestError(
            f"input[{index}] ({item.get('type')}) needs a call_id (a non-empty string)"
        )


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise CompletionRequestError(f"tools must be a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        tool = normalize_message(tool, i)
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise CompletionRequestError(f"tools[{i}] must be a function tool with a name")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": fn})
    return out or None


def _previous_conversation(cache: InteractionCache | None, previous_response_id: Any) -> list[dict[str, Any]]:
    """The chat messages a response continues: its input (without its instructions) and output."""
    if previous_response_id is None:
        return []
    if not isinstance(previous_response_id, str):
        raise CompletionRequestError(
            f"previous_response_id must be a string, got {type(previous_response_id).__name__}"
        )
    previous = cache.get(previous_response_id) if cache is not None else None
    if previous is None or previous.response is None:
        raise CompletionRequestError(
            f"previous_response_id {previous_response_id!r} is not a response of this session"
            + ("" if cache is not None else " (no cache records responses here)")
        )
    if previous.output_message_list is None:
        raise CompletionRequestError(f"previous_response_id {previous_response_id!r} has not completed yet")
    had_instructions = previous.response.instructions is not None
    kept = previous.messages[1 if had_instructions else 0 :] + previous.output_message_list
    return [
        normalize_message(m, i) for i, m in enumerate(kept)
    ]  # copies: nothing shared with the earlier call


def _count_reasoning_tokens(tokenizer: Any, text: str) -> int:
    start = text.find(THINK_OPEN)
    if start < 0:
        return 0
    end = text.find(THINK_CLOSE, start)
    inner = text[start + len(THINK_OPEN) : end if end >= 0 else len(text)]
    return len(tokenizer.encode(inner, add_special_tokens=False))


async def create_response(
    *,
    engine: InferenceEngine,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    input: Any = None,
    instructions: str | None = None,
    tools: Any = None,
    tool_choice: Any = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_output_tokens: int | None = None,
    metadata: dict[str, Any] | None = None,
    include: Any = None,
    extra_body: dict[str, Any] | None = None,
    previous_response_id: str | None = None,
    store: bool | None = None,
    model: str | None = None,
    **ignored: Any,
):
    """One OpenAI Response; the call is recorded in `cache` unless `store=False` (as on the chat
    door: answered, not recorded, and so not a `previous_response_id` later, as in OpenAI's API).
    `model` names the agent that made the call (`InteractionWithTokenLogpReward.agent`).

    `previous_response_id` continues a response of the same cache: its conversation (input and
    output, without its instructions, as in the OpenAI API) comes before this call's input.
    """
    # Reads top to bottom: convert the request, call the core, render the Response; its length is
    # the field-by-field keyword lists of the core call and of the Response (one field a line).
    from openai.types.responses import Response

    if include:
        raise CompletionRequestError("include is not supported")
    if ignored.get("conversation") is not None:
        raise CompletionRequestError(
            "conversation is not supported; send previous_response_id or the whole input"
        )
    messages = _chat_messages(cache, previous_response_id, input, instructions)
    chat_tools = _chat_tools(tools)
    check_tools(chat_tools, tool_choice)
    constraint = _response_constraint(chat_tools, tool_choice, ignored.get("text"), extra_body)
    response_id = "resp-" + uuid.uuid4().hex[:29]
    backend = CompletionBackend(engine, tokenizer, settings, cache).recording(store)
    interaction, model_response = await generate_for_messages(
        backend,
        interaction_id=response_id,
        messages=messages,
        tools=chat_tools,
        chat_template_kwargs=chat_template_kwargs_of(extra_body),
        budget_kwargs={"max_completion_tokens": max_output_tokens},
        sampling=SamplingRequest(
            temperature=temperature, top_p=top_p, stop=ignored.get("stop"), constraint=constraint
        ),
        metadata=metadata,
        input_data=input,
        agent=agent_name(model),
    )
    text, calls = _reply(
        tokenizer, settings, model_response, ignored.get("stop"), bool(chat_tools) and tool_choice != "none"
    )
    response = Response(
        id=response_id,
        created_at=float(int(time.time())),
        model=MODEL_NAME,
        object="response",
        output=_output_items(text, calls),
        parallel_tool_calls=False,
        tool_choice=tool_choice if isinstance(tool_choice, str) else "auto",
        tools=[],
        status="completed",
        instructions=instructions,
        previous_response_id=previous_response_id,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        top_p=top_p,
        usage=_response_usage(model_response, _count_reasoning_tokens(tokenizer, text)),
    )
    interaction.response = response
    interaction.output_message_list = response_items_to_messages(
        [o.model_dump(exclude_none=True) for o in response.output]
    )
    if backend.cache is not None:
        backend.cache.mark_completed(response_id)
    return response


def _chat_messages(
    cache: InteractionCache | None, previous_response_id: Any, input: Any, instructions: str | None
) -> list[dict[str, Any]]:
    """The chat conversation of a Responses request: the previous response's conversation, the
    input items as chat messages, the instructions as a leading system message."""
    history = _previous_conversation(cache, previous_response_id)
    if input is None:
        raise CompletionRequestError("input is required for Responses.create")
    if isinstance(input, str):
        items = [{"role": "user", "content": input}]
    elif isinstance(input, list):
        items = [normalize_message(item, i) for i, item in enumerate(input)]
    else:
        raise MessageTypeError(f"input must be a string or a list of items, got {type(input).__name__}")
    messages = history + response_items_to_messages(items)
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
    if not messages:
        raise CompletionRequestError("input cannot be empty")
    return messages


def _response_constraint(
    chat_tools: list[dict[str, Any]] | None, tool_choice: Any, text_options: Any, extra_body: Any
) -> OutputConstraint | None:
    """The engine constraint of `text.format`, a forced `tool_choice` or vLLM's guided options."""
    if text_options is not None and not isinstance(text_options, dict):
        raise CompletionRequestError(
            f"text must be an object like {{'format': {{...}}}}, got {text_options!r:.80}"
        )
    return request_constraint(
        {
            "text.format": constraint_of_format((text_options or {}).get("format"), "text.format"),
            "tool_choice": constraint_of_tool_choice(chat_tools, tool_choice),
            **constraint_of_guided(extra_body),
        }
    )


def _reply(
    tokenizer: Any, settings: CompletionSettings, model_response: ModelResponse, stop: Any, parse_calls: bool
) -> tuple[str, list[ParsedToolCall]]:
    """The reply's text (without the stop string that ended it) and the tool calls parsed out of it."""
    text, _ = cut_stop_string(decode_output(tokenizer, model_response), model_response, stop)
    if not parse_calls:
        return text, []
    calls, parsed_text = parse_tool_calls(text, settings.tool_call_parser, settings.reasoning_parser)
    return (parsed_text, calls) if calls else (text, [])


def _output_items(text: str, calls: list[ParsedToolCall]) -> list[Any]:
    """The response's output: a message with the text (also when empty and no call was made),
    then one `function_call` item per parsed tool call."""
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    output: list[Any] = []
    if text or not calls:
        output.append(
            ResponseOutputMessage(
                id="msg-" + uuid.uuid4().hex[:29],
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        )
    for c in calls:
        output.append(
            ResponseFunctionToolCall(
                type="function_call",
                id="fc-" + uuid.uuid4().hex[:24],
                call_id=c.id,
                name=c.name,
                arguments=c.arguments,
                status="completed",
            )
        )
    return output


def _response_usage(model_response: ModelResponse, reasoning_tokens: int) -> Any:
    from openai.types.responses import ResponseUsage
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

    n_in, n_out = model_response.input_len, model_response.output_len
    return ResponseUsage(
        input_tokens=n_in,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=n_out,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=n_in + n_out,
    )

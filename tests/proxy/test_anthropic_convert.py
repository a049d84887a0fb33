"""Anthropic Messages ⇄ chat conversion (pure functions), checked against the SDK's own types."""

from __future__ import annotations

import json

import anthropic.types as at
import pytest
from openai.types.chat import ChatCompletion
from pydantic import TypeAdapter

from areal_nb.capture.anthropic import (
    AnthropicRequestError,
    anthropic_request_to_chat,
    anthropic_stream_events,
    chat_completion_to_anthropic,
    format_sse,
    tool_arguments_of,
)

TOOLS = [
    {
        "name": "add",
        "description": "add two ints",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    }
]


def _completion(content: str, tool_calls=None, finish="stop") -> ChatCompletion:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-abc",
            "object": "chat.completion",
            "created": 1,
            "model": "areal-nb",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }
    )


def test_request_with_system_tools_tool_use_and_results():
    body = {
        "model": "m",
        "max_tokens": 32,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "add"},
        "stop_sequences": ["END"],
        "temperature": 0.0,
        "top_k": 3,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "add"}, {"type": "text", "text": "1 and 2"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": [{"type": "text", "text": "3"}],
                    },
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
    }
    out = anthropic_request_to_chat(body, {"call_1": '{"a":1}'})
    assert out["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "add\n1 and 2"},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "user", "content": "thanks"},
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "add two ints",
                "parameters": TOOLS[0]["input_schema"],
            },
        }
    ]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert out["max_completion_tokens"] == 32 and out["stop"] == ["END"] and out["temperature"] == 0.0
    assert out["top_k"] == 3  # honoured by the engine (it was dropped before)


def test_tool_arguments_are_reserialised_when_unknown_or_changed():
    msg = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {"x": "é"}}],
    }
    body = {"max_tokens": 1, "messages": [{"role": "user", "content": "q"}, msg]}
    assert (
        anthropic_request_to_chat(body)["messages"][1]["tool_calls"][0]["function"]["arguments"]
        == '{"x": "é"}'
    )
    stale = anthropic_request_to_chat(body, {"c": '{"x": "other"}'})
    assert stale["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"x": "é"}'
    assert stale["messages"][1]["content"] == ""


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"messages": []}, "non-empty"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 3}]}, "content"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}
                ]
            },
            "assistant",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "text must be a string"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            "server tool",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": TOOLS,
                "tool_choice": {"type": "maybe"},
            },
            "tool_choice",
        ),
    ],
)
def test_bad_requests_raise_clear_errors(body, needle):
    with pytest.raises(AnthropicRequestError, match=needle):
        anthropic_request_to_chat({"max_tokens": 4, **body})


def test_completion_to_message_validates_as_sdk_message():
    calls = [{"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]
    message = chat_completion_to_anthropic(_completion("Let me add.", calls, "tool_calls"), model="claude-x")
    parsed = at.Message.model_validate(message)
    assert parsed.id == "chatcmpl-abc" and parsed.model == "claude-x" and parsed.stop_reason == "tool_use"
    assert [b.type for b in parsed.content] == ["text", "tool_use"]
    assert (
        parsed.content[1].input == {"a": 2}
        and parsed.usage.input_tokens == 11
        and parsed.usage.output_tokens == 5
    )
    assert tool_arguments_of(_completion("", calls)) == {"call_9": '{"a": 2}'}
    # round trip: the echoed assistant message converts back to the recorded chat message
    echoed = anthropic_request_to_chat(
        {
            "max_tokens": 1,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": message["content"]},
            ],
        },
        {"call_9": '{"a": 2}'},
    )["messages"][1]
    assert echoed == _completion("Let me add.", calls).choices[0].message.model_dump(exclude_none=True)


@pytest.mark.parametrize(
    "finish,stop_reason", [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use")]
)
def test_stop_reasons(finish, stop_reason):
    assert chat_completion_to_anthropic(_completion("x", finish=finish), "m")["stop_reason"] == stop_reason


def test_empty_text_gives_no_text_block():
    assert chat_completion_to_anthropic(_completion(""), "m")["content"] == []


def test_stream_event_sequence_rebuilds_the_message():
    calls = [{"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]
    message = chat_completion_to_anthropic(_completion("Let me add.", calls, "tool_calls"), model="m")
    events = anthropic_stream_events(message)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    adapter = TypeAdapter(at.RawMessageStreamEvent)
    for name, data in events:  # every event is a valid SDK stream event
        assert data["type"] == name and adapter.validate_python(data).type == name
    assert json.loads(events[5][1]["delta"]["partial_json"]) == {"a": 2}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"] == {
        "output_tokens": 5
    }
    text = format_sse(events)
    assert text.startswith("event: message_start\ndata: {") and text.endswith(
        'data: {"type": "message_stop"}\n\n'
    )


def test_a_matched_stop_sequence_is_reported_as_anthropic_does():
    completion = _completion("The answer is 5")
    completion.choices[0].stop_reason = "."  # the matched stop string (set by the completion logic)
    message = chat_completion_to_anthropic(completion, "m")
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", ".")
    assert message["content"] == [{"type": "text", "text": "The answer is 5"}]
    assert anthropic_stream_events(message)[-2][1]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": ".",
    }
    at.Message.model_validate(message)

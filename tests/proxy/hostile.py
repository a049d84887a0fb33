"""A catalogue of hostile requests, one or more per class of hostile input, shared by the per-class
tests and the chaos test. Bodies are sent as raw bytes (`json.dumps` with its defaults), so lone
surrogates travel as `\\ud800` escapes exactly as a careless client would send them.

Every entry is `Hostile(name, path, body, status, needle)`: the expected status and a substring
of the error message. Session routes run with a fresh session key, admin routes with the admin key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import httpx

from tests.proxy.conftest import PROXY_ADMIN_KEY

CONTEXT = 512  # tiny-math's max_position_embeddings
ADMIN_PATHS = ("/grant_capacity", "/rl/start_session", "/export_trajectories")


def chat(content: Any = "2+2?", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def anthropic(content: Any = "2+2?", **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-math",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: Any
    status: int
    needle: str

    @cached_property
    def content(self) -> bytes:
        """The body as sent, encoded once: dumping a 7 MB body costs the client ~20 ms of CPU
        each time, which the chaos test's server would otherwise compete with on a small machine."""
        return encode(self.body)


HUGE = "7+" * 3_500_000  # 7 MB: more than tiny-math's context can use, refused unread (413)
BIG = "7+" * 400_000  # 800 kB: read, but refused before tokenizing (400)
LONG = "1+" * 3_000  # fits the character bound, but not the 512-token context
LONE = "\ud800"

HOSTILE: list[Hostile] = [
    # 1. input errors found late must be 400s in the route's dialect
    Hostile(
        "prompt over the context (chat)",
        "/v1/chat/completions",
        chat(LONG),
        400,
        f"This model's maximum context length is {CONTEXT} tokens",
    ),
    Hostile(
        "prompt over the context (anthropic)",
        "/v1/messages",
        anthropic(LONG),
        400,
        f"prompt is too long: 6008 tokens > {CONTEXT - 1} maximum",
    ),
    Hostile(
        "prompt over the context (responses)",
        "/v1/responses",
        {"input": LONG, "max_output_tokens": 4},
        400,
        "Your input exceeds the context window of this model",
    ),
    Hostile(
        "frequency_penalty",
        "/v1/chat/completions",
        chat(frequency_penalty=0.5),
        400,
        "frequency_penalty is not supported",
    ),
    Hostile(
        "presence_penalty",
        "/v1/chat/completions",
        chat(presence_penalty=-1),
        400,
        "presence_penalty is not supported",
    ),
    Hostile("empty stop string", "/v1/chat/completions", chat(stop=""), 400, "non-empty"),
    Hostile("empty stop sequence", "/v1/messages", anthropic(stop_sequences=["", "x"]), 400, "non-empty"),
    Hostile(
        "too many stops",
        "/v1/chat/completions",
        chat(stop=[str(i) for i in range(17)]),
        400,
        "at most 16 stop strings",
    ),
    Hostile(
        "max_tokens over the context",
        "/v1/chat/completions",
        chat(max_tokens=CONTEXT + 1),
        400,
        "larger than the model context",
    ),
    # 2. size: refused before tokenizing
    Hostile("7 MB prompt (chat)", "/v1/chat/completions", chat(HUGE), 413, "body too large"),
    Hostile("7 MB prompt (anthropic)", "/v1/messages", anthropic(HUGE), 413, "body too large"),
    Hostile("800 kB prompt (chat)", "/v1/chat/completions", chat(BIG), 400, "prompt is too long"),
    Hostile("800 kB prompt (anthropic)", "/v1/messages", anthropic(BIG), 400, "prompt is too long"),
    Hostile("800 kB prompt (responses)", "/v1/responses", {"input": BIG}, 400, "prompt is too long"),
    Hostile(
        "too many messages",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": ""}] * 600},
        400,
        "messages cannot fit",
    ),
    # 3. deep nesting, wherever it is
    Hostile("deep content", "/v1/chat/completions", chat(nested(300)), 400, "nested"),
    Hostile(
        "deep tool schema",
        "/v1/chat/completions",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": nested(400)}}]),
        400,
        "nested",
    ),
    Hostile(
        "deep responses item",
        "/v1/responses",
        {"input": [{"role": "user", "content": nested(300)}]},
        400,
        "nested",
    ),
    Hostile(
        "deep anthropic block",
        "/v1/messages",
        anthropic([{"type": "tool_result", "tool_use_id": "t", "content": nested(300)}]),
        400,
        "nested",
    ),
    Hostile(
        "deep reward body",
        "/rl/set_reward",
        b'{"reward": 1, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        400,
        "nested",
    ),
    # 4. invalid text, rendered or not
    Hostile("lone surrogate in content", "/v1/chat/completions", chat("2+2" + LONE), 400, "surrogate"),
    Hostile(
        "lone surrogate in metadata", "/v1/chat/completions", chat(metadata={"note": LONE}), 400, "surrogate"
    ),
    Hostile("lone surrogate in a key", "/v1/chat/completions", chat(**{LONE: 1}), 400, "surrogate"),
    Hostile("lone low surrogate (responses)", "/v1/responses", {"input": "\udc00"}, 400, "surrogate"),
    Hostile("lone surrogate (anthropic system)", "/v1/messages", anthropic(system=LONE), 400, "surrogate"),
    Hostile(
        "lone surrogate in a reward id",
        "/rl/set_reward",
        {"reward": 1, "interaction_id": LONE},
        400,
        "surrogate",
    ),
    # 5. degenerate sampling parameters
    Hostile(
        "temperature 1e-300", "/v1/chat/completions", chat(temperature=1e-300), 400, "temperature must be 0"
    ),
    Hostile(
        "temperature 1e-300 (anthropic)",
        "/v1/messages",
        anthropic(temperature=1e-300),
        400,
        "temperature must be 0",
    ),
    Hostile(
        "temperature 1e-300 (responses)",
        "/v1/responses",
        {"input": "hi", "temperature": 1e-300},
        400,
        "temperature must be 0",
    ),
    Hostile(
        "temperature NaN",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        422,
        "temperature",
    ),
    # ranges are one rule (GenerationConfig.check) on every route: 400, not a schema's 422
    Hostile("top_p 0", "/v1/chat/completions", chat(top_p=0), 400, "top_p must be in (0, 1]"),
    Hostile(
        "top_p 2 (responses)", "/v1/responses", {"input": "hi", "top_p": 2}, 400, "top_p must be in (0, 1]"
    ),
    Hostile(
        "temperature 101 (anthropic)",
        "/v1/messages",
        anthropic(temperature=101),
        400,
        "temperature must be 0",
    ),
    Hostile("temperature -1", "/v1/chat/completions", chat(temperature=-1), 400, "temperature must be 0"),
    # 6. chat_template_kwargs: template variables only
    Hostile(
        "replace the template",
        "/v1/chat/completions",
        chat(chat_template_kwargs={"chat_template": "{{ 'owned' }}"}),
        400,
        "not variables of this model's chat template",
    ),
    Hostile(
        "truncate the prompt",
        "/v1/chat/completions",
        chat(extra_body={"chat_template_kwargs": {"truncation": True, "max_length": 2}}),
        400,
        "allowed keys",
    ),
    Hostile(
        "tokenize=False",
        "/v1/responses",
        {"input": "hi", "chat_template_kwargs": {"tokenize": False}},
        400,
        "allowed keys",
    ),
    # 8. the Responses path checks what chat checks
    Hostile(
        "function_call without name",
        "/v1/responses",
        {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
        400,
        "without a name",
    ),
    Hostile(
        "unknown role (responses)",
        "/v1/responses",
        {"input": [{"role": "robot", "content": "hi"}]},
        400,
        "role must be one of",
    ),
    Hostile(
        "unknown role (chat)",
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "role must be one of",
    ),
    Hostile(
        "tool call without a name (chat)",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}],
                },
            ]
        },
        400,
        "function.name",
    ),
    # 9. keys that can never authenticate
    Hostile(
        "key with edge spaces",
        "/rl/start_session",
        {"task_id": "evil", "api_key": " spaced-key-123 "},
        400,
        "visible ASCII",
    ),
    Hostile(
        "key with control chars",
        "/rl/start_session",
        {"task_id": "evil", "api_key": "ctrl\x01key-123"},
        400,
        "visible ASCII",
    ),
    Hostile(
        "non-ASCII key",
        "/rl/start_session",
        {"task_id": "evil", "api_key": "ключ-123456"},
        400,
        "visible ASCII",
    ),
    Hostile("empty key", "/rl/start_session", {"task_id": "evil", "api_key": ""}, 422, "api_key"),
    Hostile(
        "newline in a task id", "/rl/start_session", {"task_id": "t\nINFO forged log line"}, 422, "task_id"
    ),
    # wrong types are refused, never coerced (a bool is no number, a string no count or flag)
    Hostile("max_tokens true", "/v1/chat/completions", chat(max_tokens=True), 422, "max_tokens"),
    Hostile("max_tokens as a string", "/v1/chat/completions", chat(max_tokens="4"), 422, "max_tokens"),
    Hostile("temperature true", "/v1/chat/completions", chat(temperature=True), 422, "temperature"),
    Hostile("temperature as a string", "/v1/chat/completions", chat(temperature="0.5"), 422, "temperature"),
    Hostile("stream as a string", "/v1/chat/completions", chat(stream="yes"), 422, "stream"),
    Hostile(
        "max_output_tokens true (responses)",
        "/v1/responses",
        {"input": "hi", "max_output_tokens": True},
        422,
        "max_output_tokens",
    ),
    Hostile(
        "max_tokens as a string (anthropic)", "/v1/messages", anthropic(max_tokens="4"), 422, "max_tokens"
    ),
    Hostile("reward true", "/rl/set_reward", {"reward": True}, 422, "reward"),
    Hostile("reward as a string", "/rl/set_reward", {"reward": "1"}, 422, "reward"),
    Hostile("capacity as a string", "/grant_capacity", {"count": "5"}, 422, "count"),
    Hostile("seed as a string", "/v1/chat/completions", chat(seed="x"), 422, "seed"),
    # options the engine cannot honour are refused, not silently dropped
    Hostile(
        "logit_bias", "/v1/chat/completions", chat(logit_bias={"5": 100}), 400, "logit_bias is not supported"
    ),
    Hostile(
        "response_format with a schema feature the grammar cannot enforce",
        "/v1/chat/completions",
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            }
        ),
        400,
        "uniqueItems",
    ),
    Hostile(
        "response_format of an unknown type",
        "/v1/chat/completions",
        chat(response_format={"type": "yaml"}),
        400,
        "response_format",
    ),
    Hostile("best_of 3", "/v1/chat/completions", chat(best_of=3), 400, "best_of"),
    Hostile(
        "top_logprobs 5", "/v1/chat/completions", chat(logprobs=True, top_logprobs=5), 400, "top_logprobs"
    ),
    Hostile(
        "legacy functions",
        "/v1/chat/completions",
        chat(functions=[{"name": "f", "parameters": {}}]),
        400,
        "tools=",
    ),
    Hostile("web search", "/v1/chat/completions", chat(web_search_options={}), 400, "web_search_options"),
    Hostile("audio output", "/v1/chat/completions", chat(modalities=["text", "audio"]), 400, "modalities"),
    Hostile(
        "structured output with an unsupported keyword (responses)",
        "/v1/responses",
        {
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {"type": "string"}}}},
        },
        400,
        "not",
    ),
    Hostile(
        "text.format of an unknown type (responses)",
        "/v1/responses",
        {"input": "hi", "text": {"format": {"type": "yaml"}}},
        400,
        "text.format",
    ),
    Hostile(
        "top_logprobs (responses)", "/v1/responses", {"input": "hi", "top_logprobs": 3}, 400, "top_logprobs"
    ),
    Hostile("top_k 0 (anthropic)", "/v1/messages", anthropic(top_k=0), 400, "top_k must be >= 1"),
    Hostile("top_k true", "/v1/chat/completions", chat(top_k=True), 422, "top_k"),
    # parts the text-only engine cannot read are refused, not dropped from the prompt
    Hostile(
        "image part (chat)",
        "/v1/chat/completions",
        chat(
            [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            ]
        ),
        400,
        "image_url",
    ),
    Hostile(
        "part without a type (chat)", "/v1/chat/completions", chat([{"text": "hi"}]), 400, "content[0].type"
    ),
    Hostile(
        "image block (anthropic)",
        "/v1/messages",
        anthropic(
            [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]
        ),
        400,
        "image",
    ),
    # tools with shapes no template can render, tool_choice naming no tool
    Hostile(
        "tool without function",
        "/v1/chat/completions",
        chat(tools=[{"type": "function"}]),
        400,
        "tools[0].function",
    ),
    Hostile(
        "tool name not a string",
        "/v1/chat/completions",
        chat(tools=[{"type": "function", "function": {"name": 5}}]),
        400,
        "tools[0].function.name",
    ),
    Hostile(
        "tool parameters not an object",
        "/v1/chat/completions",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        400,
        "parameters",
    ),
    Hostile(
        "tool of another type",
        "/v1/chat/completions",
        chat(tools=[{"type": "code_interpreter"}]),
        400,
        "tools[0].type",
    ),
    Hostile(
        "tool_choice names no tool",
        "/v1/chat/completions",
        chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "'g'",
    ),
    Hostile(
        "tool_choice required without tools",
        "/v1/chat/completions",
        chat(tool_choice="required"),
        400,
        "tool_choice",
    ),
    Hostile(
        "tool_choice names no tool (anthropic)",
        "/v1/messages",
        anthropic(
            tools=[{"name": "f", "input_schema": {"type": "object"}}],
            tool_choice={"type": "tool", "name": "g"},
        ),
        400,
        "'g'",
    ),
    Hostile(
        "tool name not a string (responses)",
        "/v1/responses",
        {"input": "hi", "tools": [{"type": "function", "name": 5}]},
        400,
        "tools[0]",
    ),
    Hostile(
        "function_call without call_id (responses)",
        "/v1/responses",
        {
            "input": [
                {"role": "user", "content": "q"},
                {"type": "function_call", "name": "f", "arguments": "{}"},
            ]
        },
        400,
        "call_id",
    ),
    Hostile(
        "function_call_output without call_id (responses)",
        "/v1/responses",
        {"input": [{"role": "user", "content": "q"}, {"type": "function_call_output", "output": "4"}]},
        400,
        "call_id",
    ),
    # bytes that are no text
    Hostile(
        "invalid UTF-8",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 4}',
        400,
        "UTF-8",
    ),
    # the text-completion and counting doors
    Hostile(
        "prompt over the context (text)",
        "/v1/completions",
        {"prompt": LONG, "max_tokens": 4},
        400,
        f"maximum context length is {CONTEXT} tokens",
    ),
    Hostile(
        "token ids over the context (text)",
        "/v1/completions",
        {"prompt": [7] * (CONTEXT + 88), "max_tokens": 4},
        400,
        f"maximum context length is {CONTEXT} tokens",
    ),
    Hostile("7 MB prompt (text)", "/v1/completions", {"prompt": HUGE}, 413, "body too large"),
    Hostile("800 kB prompt (text)", "/v1/completions", {"prompt": BIG}, 400, "prompt is too long"),
    Hostile(
        "800 kB prompt (count_tokens)",
        "/v1/messages/count_tokens",
        {"model": "tiny-math", "messages": [{"role": "user", "content": BIG}]},
        400,
        "prompt is too long",
    ),
    Hostile("lone surrogate (text)", "/v1/completions", {"prompt": "2+2" + LONE}, 400, "surrogate"),
    Hostile("lone surrogate (tokenize)", "/tokenize", {"prompt": LONE}, 400, "surrogate"),
    Hostile("800 kB prompt (tokenize)", "/tokenize", {"prompt": BIG}, 400, "prompt is too long"),
    Hostile(
        "temperature 1e-300 (text)",
        "/v1/completions",
        {"prompt": "hi", "temperature": 1e-300},
        400,
        "temperature must be 0",
    ),
]


def new_session_key(client: httpx.Client, task_id: str = "hostile") -> tuple[str, str]:
    admin = {"Authorization": f"Bearer {PROXY_ADMIN_KEY}"}
    assert client.post("/grant_capacity", headers=admin).status_code == 200
    r = client.post("/rl/start_session", headers=admin, json={"task_id": task_id})
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


def send(client: httpx.Client, case: Hostile, session_key: str | None) -> httpx.Response:
    key = PROXY_ADMIN_KEY if case.path in ADMIN_PATHS else session_key
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    return client.post(case.path, headers=headers, content=case.content)


def check_answer(case: Hostile, response: httpx.Response) -> None:
    """The expected status, the needle in the message, the route's error dialect, no retry."""
    assert response.status_code == case.status, f"{case.name}: {response.status_code} {response.text[:300]}"
    body = response.json()
    if case.path.startswith("/v1/messages"):
        kind = "request_too_large" if case.status == 413 else "invalid_request_error"
        assert body["type"] == "error" and body["error"]["type"] == kind, body
    else:
        assert body["error"]["type"] == "invalid_request_error", body
    assert case.needle in body["error"]["message"], f"{case.name}: {body['error']['message'][:300]}"
    assert response.headers.get("x-should-retry") == "false"

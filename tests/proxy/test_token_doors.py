"""The doors that count and tokenize without generating: Anthropic's `/v1/messages/count_tokens`
and vLLM's `/tokenize` / `/detokenize`. Each must give the prompt the generating door records for
the same body (so a harness that budgets its context by them budgets the real prompt), and record
nothing.

A real uvicorn server on loopback, the real Anthropic SDK and httpx; a ScriptedEngine replies.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from areal_nb.capture.completion import CompletionSettings
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, session_headers, start_session

pytestmark = pytest.mark.server

TOOLS_CHAT = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
TOOLS_ANTHROPIC = [
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module", params=["hf", "concat"])
def server(request, tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    # the reply spelled one character per token: re-encoding its text gives other tokens, so a
    # concat child's prompt (the parent's own tokens) differs from a plain render of its messages
    reply = [t for c in "The answer is 408." for t in tiny_tokenizer.encode(c, add_special_tokens=False)]
    engine = ScriptedEngine(tiny_tokenizer, reply + [tiny_tokenizer.eos_token_id])
    settings = ProxySettings(
        admin_api_key=PROXY_ADMIN_KEY, completion=CompletionSettings(chat_template_type=request.param)
    )
    with ProxyServer(create_app(engine, tiny_tokenizer, settings)) as running:
        yield running, engine


def recorded_prompts(client: httpx.Client, sid: str, key: str) -> dict[str, list[int]]:
    assert client.post("/rl/end_session", headers=session_headers(key)).status_code == 200
    exported = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert exported.status_code == 200, exported.text
    return {iid: it["model_response"]["input_tokens"] for iid, it in exported.json()["interactions"].items()}


def test_count_tokens_is_the_prompt_the_next_message_records(server):
    running, _ = server
    system = "You are a careful calculator."
    with httpx.Client(base_url=running.url) as http:
        sid, key = start_session(http, "count")
        client = anthropic.Anthropic(base_url=running.url, api_key=key, max_retries=0)
        messages: list = [{"role": "user", "content": "What is 12 times 34?"}]
        counts, ids = [], []
        for follow_up in ("And 13 times 34?", None):
            counted = client.messages.count_tokens(
                model="m", system=system, messages=messages, tools=TOOLS_ANTHROPIC
            )
            message = client.messages.create(
                model="m", max_tokens=32, system=system, messages=messages, tools=TOOLS_ANTHROPIC
            )
            counts.append(counted.input_tokens)
            ids.append(message.id)
            assert message.usage.input_tokens == counted.input_tokens
            if follow_up is not None:  # the second call continues the first (a concat child)
                messages += [
                    {
                        "role": "assistant",
                        "content": [b.model_dump(exclude_none=True) for b in message.content],
                    },
                    {"role": "user", "content": follow_up},
                ]
        prompts = recorded_prompts(http, sid, key)
    assert set(prompts) == set(ids)  # counting recorded nothing
    assert [len(prompts[i]) for i in ids] == counts
    assert counts[1] > counts[0]


def test_tokenize_messages_is_the_prompt_the_chat_door_records(server, tiny_tokenizer):
    running, engine = server
    messages: list = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12 times 34?"},
    ]
    with httpx.Client(base_url=running.url) as http:
        sid, key = start_session(http, "tokenize")
        headers = session_headers(key)
        tokenized, ids = [], []
        for follow_up in ("Again?", None):
            body = {"model": "m", "messages": messages, "tools": TOOLS_CHAT}
            answer = http.post("/tokenize", headers=headers, json=body)
            assert answer.status_code == 200, answer.text
            tokenized.append(answer.json())
            chat = http.post("/v1/chat/completions", headers=headers, json={**body, "max_tokens": 32})
            assert chat.status_code == 200, chat.text
            ids.append(chat.json()["id"])
            if follow_up is not None:
                messages += [chat.json()["choices"][0]["message"], {"role": "user", "content": follow_up}]
        prompts = recorded_prompts(http, sid, key)
    assert set(prompts) == set(ids)  # tokenizing recorded nothing
    for answer, iid in zip(tokenized, ids, strict=True):
        assert answer["tokens"] == prompts[iid]
        assert answer["count"] == len(prompts[iid])
        assert answer["max_model_len"] is None  # the scripted engine reports no context
        assert answer["token_strs"] is None
    assert tiny_tokenizer.decode(tokenized[0]["tokens"]).count('"name": "calculator"') == 1


def test_tokenize_prompt_detokenize_and_their_refusals(server, tiny_tokenizer):
    running, _ = server
    text = "Question: what is 12 times 34?\nAnswer:"
    with httpx.Client(base_url=running.url) as http:
        _, key = start_session(http, "plain")
        headers = session_headers(key)
        answer = http.post("/tokenize", headers=headers, json={"prompt": text, "return_token_strs": True})
        assert answer.status_code == 200, answer.text
        tokens = answer.json()["tokens"]
        assert tokens == tiny_tokenizer.encode(text, add_special_tokens=True)
        assert answer.json()["token_strs"] == tiny_tokenizer.convert_ids_to_tokens(tokens)
        back = http.post("/detokenize", headers=headers, json={"tokens": tokens})
        assert back.status_code == 200 and back.json() == {"prompt": text}

        without = http.post(
            "/tokenize",
            headers=headers,
            json={"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
        )
        assert without.status_code == 200, without.text
        assert tiny_tokenizer.decode(without.json()["tokens"]).endswith("hi<|im_end|>\n")

        refusals = {
            "both": ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "/tokenize", 400),
            "neither": ({}, "/tokenize", 400),
            "special": (
                {"messages": [{"role": "user", "content": "b"}], "add_special_tokens": True},
                "/tokenize",
                400,
            ),
            "bad role": ({"messages": [{"role": "robot", "content": "b"}]}, "/tokenize", 400),
            "unknown id": ({"tokens": [len(tiny_tokenizer)]}, "/detokenize", 400),
            "negative id": ({"tokens": [-1]}, "/detokenize", 400),
            "not ids": ({"tokens": ["a"]}, "/detokenize", 422),
        }
        for name, (body, path, status) in refusals.items():
            refused = http.post(path, headers=headers, json=body)
            assert refused.status_code == status, (name, refused.text)
            assert refused.json()["error"]["message"], name  # OpenAI's error shape
        # the same keys as every door: none, the admin key, a wrong one
        for bad in ({}, admin_headers(), session_headers("not-a-session-key")):
            assert http.post("/tokenize", headers=bad, json={"prompt": "a"}).status_code == 401
            assert http.post("/detokenize", headers=bad, json={"tokens": [1]}).status_code == 401
        client = anthropic.Anthropic(base_url=running.url, api_key="not-a-session-key", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
        # an Anthropic error for an Anthropic door
        bad_block = http.post(
            "/v1/messages/count_tokens",
            headers=headers,
            json={"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        )
        assert bad_block.status_code == 400 and bad_block.json()["type"] == "error", bad_block.text


def test_counting_answers_past_the_context_but_reads_no_text_that_cannot_fit(make_app, tiny_tokenizer):
    from fastapi.testclient import TestClient

    from areal_nb.capture.request_limits import max_chars_per_token

    engine = ScriptedEngine(tiny_tokenizer, "4")
    engine.max_context = 8
    longest = max_chars_per_token(tiny_tokenizer)
    over = "1+" * 10  # 20 tokens: over the context, still counted
    unreadable = "x" * (7 * longest + 1)  # more characters than 7 tokens can hold
    with TestClient(make_app(engine)) as http:
        _, key = start_session(http, "context")
        headers = session_headers(key)
        counted = http.post("/tokenize", headers=headers, json={"prompt": over})
        assert counted.status_code == 200 and counted.json()["count"] == 20
        assert counted.json()["max_model_len"] == 8
        messages = {"model": "m", "messages": [{"role": "user", "content": over}]}
        assert (
            http.post("/v1/messages/count_tokens", headers=headers, json=messages).json()["input_tokens"] > 20
        )
        for path, body in (
            ("/tokenize", {"prompt": unreadable}),
            (
                "/v1/messages/count_tokens",
                {"model": "m", "messages": [{"role": "user", "content": unreadable}]},
            ),
            ("/v1/completions", {"prompt": unreadable}),
        ):
            refused = http.post(path, headers=headers, json=body)
            assert (
                refused.status_code == 400 and "prompt is too long" in refused.json()["error"]["message"]
            ), path
            # an overflow in the words harnesses match: OpenAI's code, Anthropic's message
            assert refused.json()["error"].get("code", "context_length_exceeded") == "context_length_exceeded"
        generating = http.post("/v1/completions", headers=headers, json={"prompt": over})
        assert (
            generating.status_code == 400 and generating.json()["error"]["code"] == "context_length_exceeded"
        )
        assert "maximum context length is 8 tokens" in generating.json()["error"]["message"]

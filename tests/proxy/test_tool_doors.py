"""One tool, three doors: an agent offering the same function tool through /v1/chat/completions,
/v1/responses or /v1/messages (each in its own SDK's format) must put the same prompt in front of
the model, and its tool round trip must be recorded the same way.

A real uvicorn server on loopback and the real OpenAI and Anthropic SDKs; a ScriptedEngine replies
with a tool call, then (once the prompt holds the tool's result) with the answer. The twin on the
real model is tests/test_tool_doors_training.py (tiny-tools emits the tool calls itself).
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest

from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, start_session

pytestmark = pytest.mark.server

PARAMETERS = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
DESCRIPTION = "Evaluate an arithmetic expression."
QUESTION = "What is 12 times 34?"
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'


async def chat_door(url: str, key: str) -> list[str]:
    tools = [
        {
            "type": "function",
            "function": {"name": "calculator", "description": DESCRIPTION, "parameters": PARAMETERS},
        }
    ]
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        messages = [{"role": "user", "content": QUESTION}]
        first = await client.chat.completions.create(
            model="m", messages=messages, tools=tools, max_completion_tokens=64
        )
        call = first.choices[0].message.tool_calls[0]
        assert json.loads(call.function.arguments) == {"expression": "12*34"}
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "408"},
        ]
        second = await client.chat.completions.create(
            model="m", messages=messages, tools=tools, max_completion_tokens=64
        )
        assert second.choices[0].message.content == "The answer is 408."
        return [first.id, second.id]


async def responses_door(url: str, key: str) -> list[str]:
    tools = [{"type": "function", "name": "calculator", "description": DESCRIPTION, "parameters": PARAMETERS}]
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        items: list = [{"role": "user", "content": QUESTION}]
        first = await client.responses.create(model="m", input=items, tools=tools, max_output_tokens=64)
        call = next(o for o in first.output if o.type == "function_call")
        assert json.loads(call.arguments) == {"expression": "12*34"}
        items += [
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "408"},
        ]
        second = await client.responses.create(model="m", input=items, tools=tools, max_output_tokens=64)
        assert second.output_text == "The answer is 408."
        return [first.id, second.id]


async def messages_door(url: str, key: str) -> list[str]:
    tools = [{"name": "calculator", "description": DESCRIPTION, "input_schema": PARAMETERS}]
    async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as client:
        messages: list = [{"role": "user", "content": QUESTION}]
        first = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
        use = next(b for b in first.content if b.type == "tool_use")
        assert use.input == {"expression": "12*34"} and first.stop_reason == "tool_use"
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "408"}]},
        ]
        second = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
        assert "".join(b.text for b in second.content if b.type == "text") == "The answer is 408."
        return [first.id, second.id]


DOORS = {"chat": chat_door, "responses": responses_door, "messages": messages_door}


@pytest.fixture(scope="module")
def calculator_server(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    def reply(req):
        return (
            "The answer is 408." if "<tool_response>" in tiny_tokenizer.decode(req.input_ids) else CALL_TEXT
        )

    engine = ScriptedEngine(tiny_tokenizer, reply)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with ProxyServer(app) as server:
        yield server, engine


def run_door(server, door: str) -> tuple[list[str], dict]:
    with httpx.Client(base_url=server.url) as client:
        sid, key = start_session(client, door)
        ids = asyncio.run(DOORS[door](server.url, key))
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        exported = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
        assert exported.status_code == 200, exported.text
        return ids, exported.json()["interactions"]


def test_the_same_tool_puts_the_same_prompt_before_the_model_through_every_door(
    calculator_server, tiny_tokenizer
):
    server, engine = calculator_server
    prompts = {}
    for door in DOORS:
        engine.requests.clear()
        ids, wire = run_door(server, door)
        prompts[door] = [list(r.input_ids) for r in engine.requests]
        assert len(prompts[door]) == 2
        # the answer is the tool call's child, and its prompt ends with the tool's result
        assert wire[ids[1]]["parent_id"] == ids[0]
        assert (
            wire[ids[1]]["messages"][-1]["role"] == "tool"
            and wire[ids[1]]["messages"][-1]["content"] == "408"
        )
    first_prompt = tiny_tokenizer.decode(prompts["chat"][0])
    assert (
        '{"name": "calculator", "description": "Evaluate an arithmetic expression.", "parameters"'
        in first_prompt
    )
    assert prompts["responses"] == prompts["chat"]
    assert prompts["messages"] == prompts["chat"]

"""End to end on a real uvicorn server on loopback, driven by the real OpenAI and Anthropic SDKs.

Tool-call tests drive a ScriptedEngine (the tiny model cannot be made to emit a tool call on
demand); each has a twin on the real tiny model (LocalEngine + tiny-math) that sends the same
request shape and checks what is recorded.
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

pytestmark = pytest.mark.server  # real uvicorn servers on loopback

OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
ANTHROPIC_TOOLS = [
    {"name": "add", "description": "add", "input_schema": OPENAI_TOOLS[0]["function"]["parameters"]}
]
TOOL_CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def _session(url: str, task: str) -> tuple[str, str]:
    with httpx.Client(base_url=url) as client:
        return start_session(client, task)


def _export(url: str, sid: str, key: str) -> dict:
    with httpx.Client(base_url=url) as client:
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        r = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
        assert r.status_code == 200, r.text
        return r.json()["interactions"]


def _check_tokens(item: dict) -> None:
    mr, td = item["model_response"], item["tensor_dict"]
    n_in, n_out = len(mr["input_tokens"]), len(mr["output_tokens"])
    assert n_out > 0 and td["input_ids"] == mr["input_tokens"] + mr["output_tokens"]
    assert td["loss_mask"] == [0] * n_in + [1] * n_out
    assert td["logprobs"][n_in:] == mr["output_logprobs"] and all(lp <= 0 for lp in mr["output_logprobs"])


@pytest.fixture(scope="module")
def tool_server(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    def reply(req):
        prompt = tiny_tokenizer.decode(req.input_ids)
        return "The sum is 3" if "<tool_response>" in prompt else TOOL_CALL_TEXT

    app = create_app(
        ScriptedEngine(tiny_tokenizer, reply), tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY)
    )
    with ProxyServer(app) as server:
        yield server


# ----------------------------------------------------------------------------- OpenAI
async def _openai_two_turns(url: str, key: str, stream: bool, tools: bool) -> list[str]:
    extra = {"tools": OPENAI_TOOLS} if tools else {}
    messages: list = [{"role": "user", "content": "What is 1 + 2?"}]
    ids = []
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        for _turn in range(2):
            if stream:
                s = await client.chat.completions.create(
                    model="tiny-math",
                    messages=messages,
                    max_completion_tokens=48,
                    temperature=0.0,
                    stream=True,
                    **extra,
                )
                chunks = [c async for c in s]
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
                finish = chunks[-1].choices[0].finish_reason
                cid = chunks[0].id
                assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
                message = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in calls
                    ]
            else:
                completion = await client.chat.completions.create(
                    model="tiny-math", messages=messages, max_completion_tokens=48, temperature=0.0, **extra
                )
                cid, finish = completion.id, completion.choices[0].finish_reason
                message = completion.choices[0].message.model_dump(exclude_none=True)
                calls = message.get("tool_calls") or []
                assert completion.usage.completion_tokens > 0
            ids.append(cid)
            messages.append(message)
            if calls:
                assert finish == "tool_calls"
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": calls[0]["id"] if isinstance(calls[0], dict) else calls[0].id,
                        "content": "3",
                    }
                )
            else:
                assert finish in ("stop", "length")
                messages.append({"role": "user", "content": "Are you sure?"})
    return ids, messages


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_call_scripted(tool_server, stream):
    sid, key = _session(tool_server.url, "oai-tool")
    ids, messages = asyncio.run(_openai_two_turns(tool_server.url, key, stream, tools=True))
    call = messages[1]["tool_calls"][0]
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert messages[3]["content"] == "The sum is 3"
    wire = _export(tool_server.url, sid, key)
    assert list(wire) == ids and wire[ids[1]]["parent_id"] == ids[0]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_on_tiny_model(local_server, stream):
    """Twin of the scripted tool test: same request shape (with tools) on the real model."""
    sid, key = _session(local_server.url, "oai-real")
    ids, messages = asyncio.run(_openai_two_turns(local_server.url, key, stream, tools=True))
    wire = _export(local_server.url, sid, key)
    assert list(wire) == ids
    for item in wire.values():
        _check_tokens(item)
        assert item["tools"] == OPENAI_TOOLS
    assert wire[ids[1]]["parent_id"] == ids[0]  # the echoed reply links the turns
    assert wire[ids[0]]["output_message_list"][0]["content"] == messages[1]["content"]


# ----------------------------------------------------------------------------- Anthropic
async def _anthropic_two_turns(url: str, key: str, stream: bool, tools: bool):
    extra = {"tools": ANTHROPIC_TOOLS} if tools else {}
    messages: list = [{"role": "user", "content": "What is 1 + 2?"}]
    results = []
    async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0) as client:
        for _ in range(2):
            if stream:
                async with client.messages.stream(
                    model="tiny-math", system="You add.", messages=messages, max_tokens=48, **extra
                ) as s:
                    names = [event.type async for event in s]
                    message = await s.get_final_message()
                assert names[0] == "message_start" and names[-1] == "message_stop"
            else:
                message = await client.messages.create(
                    model="tiny-math", system="You add.", messages=messages, max_tokens=48, **extra
                )
            assert message.model == "tiny-math" and message.usage.output_tokens > 0
            results.append(message)
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
            )
            tool_uses = [b for b in message.content if b.type == "tool_use"]
            if tool_uses:
                assert message.stop_reason == "tool_use"
                messages.append(
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": tool_uses[0].id, "content": "3"}],
                    }
                )
            else:
                assert message.stop_reason in ("end_turn", "max_tokens")
                messages.append({"role": "user", "content": "Are you sure?"})
    return results


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_use_scripted(tool_server, stream):
    sid, key = _session(tool_server.url, "ant-tool")
    first, second = asyncio.run(_anthropic_two_turns(tool_server.url, key, stream, tools=True))
    tool_use = first.content[0]
    assert tool_use.type == "tool_use" and tool_use.name == "add" and tool_use.input == {"a": 1, "b": 2}
    assert [b.text for b in second.content] == ["The sum is 3"] and second.stop_reason == "end_turn"
    wire = _export(tool_server.url, sid, key)
    assert list(wire) == [first.id, second.id]
    assert wire[second.id]["parent_id"] == first.id  # tool_use echo converts back exactly
    assert wire[second.id]["messages"][0] == {"role": "system", "content": "You add."}
    assert wire[second.id]["messages"][-1] == {"role": "tool", "tool_call_id": tool_use.id, "content": "3"}


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_on_tiny_model(local_server, stream):
    sid, key = _session(local_server.url, "ant-real")
    first, second = asyncio.run(_anthropic_two_turns(local_server.url, key, stream, tools=True))
    wire = _export(local_server.url, sid, key)
    assert list(wire) == [first.id, second.id]
    for item in wire.values():
        _check_tokens(item)
    assert wire[second.id]["parent_id"] == first.id
    text = "".join(b.text for b in first.content if b.type == "text")
    assert wire[first.id]["output_message_list"][0]["content"] == text


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_stop_sequence_on_tiny_model(local_server, tiny_tokenizer, stream):
    """A stop sequence ends the real model's reply: Anthropic's stop_reason/stop_sequence, the
    text without it; the recorded tokens (trained on) still hold it."""
    sid, key = _session(local_server.url, f"ant-stop-{stream}")
    stops = [" ", "{", "\\", *"0123456789"]  # every tiny-math answer hits one of these

    async def run():
        async with anthropic.AsyncAnthropic(base_url=local_server.url, api_key=key, max_retries=0) as client:
            request = {
                "model": "m",
                "max_tokens": 24,
                "stop_sequences": stops,
                "messages": [{"role": "user", "content": "What is 2 + 3?"}],
            }
            if stream:
                async with client.messages.stream(**request) as s:
                    return await s.get_final_message()
            return await client.messages.create(**request)

    message = asyncio.run(run())
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in stops
    text = "".join(b.text for b in message.content if b.type == "text")
    wire = _export(local_server.url, sid, key)
    tokens = wire[message.id]["model_response"]["output_tokens"]
    assert tiny_tokenizer.decode(tokens).startswith(text + message.stop_sequence)
    assert wire[message.id]["output_message_list"][0]["content"] == text
    _check_tokens(wire[message.id])


def test_anthropic_set_reward_by_message_id(local_server):
    sid, key = _session(local_server.url, "ant-reward")
    first, _ = asyncio.run(_anthropic_two_turns(local_server.url, key, False, tools=False))
    with httpx.Client(base_url=local_server.url) as client:
        r = client.post(
            "/rl/set_reward", headers={"x-api-key": key}, json={"interaction_id": first.id, "reward": 1.0}
        )
        assert r.status_code == 200
    wire = _export(local_server.url, sid, key)
    assert wire[first.id]["reward"] == 1.0


# ----------------------------------------------------------------------------- Responses
def test_responses_function_call_round_trip_scripted(tool_server):
    sid, key = _session(tool_server.url, "resp-tool")

    async def run():
        async with openai.AsyncOpenAI(
            base_url=tool_server.url, api_key=key, max_retries=0
        ) as client:  # no /v1
            first = await client.responses.create(
                model="m",
                input="What is 1 + 2?",
                tools=[
                    {
                        "type": "function",
                        "name": "add",
                        "parameters": OPENAI_TOOLS[0]["function"]["parameters"],
                    }
                ],
                max_output_tokens=48,
            )
            call = first.output[0]
            assert (
                call.type == "function_call"
                and call.name == "add"
                and json.loads(call.arguments) == {"a": 1, "b": 2}
            )
            second = await client.responses.create(
                model="m",
                input=[
                    {"role": "user", "content": "What is 1 + 2?"},
                    call.model_dump(exclude_none=True),
                    {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
                ],
                max_output_tokens=48,
            )
            return first, second

    first, second = asyncio.run(run())
    assert second.output_text == "The sum is 3"
    wire = _export(tool_server.url, sid, key)
    assert list(wire) == [first.id, second.id]
    assert wire[second.id]["messages"][-1] == {
        "role": "tool",
        "content": "3",
        "tool_call_id": first.output[0].call_id,
    }


def test_responses_previous_response_id_scripted(tool_server):
    """The SDK sends only the new item with `previous_response_id`: the proxy builds the prompt
    from the stored conversation, links the call to its parent, and refuses an unknown id."""
    sid, key = _session(tool_server.url, "resp-prev")
    tools = [{"type": "function", "name": "add", "parameters": OPENAI_TOOLS[0]["function"]["parameters"]}]

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{tool_server.url}/v1", api_key=key, max_retries=0) as client:
            first = await client.responses.create(
                model="m", input="What is 1 + 2?", tools=tools, max_output_tokens=48
            )
            second = await client.responses.create(
                model="m",
                previous_response_id=first.id,
                tools=tools,
                max_output_tokens=48,
                input=[{"type": "function_call_output", "call_id": first.output[0].call_id, "output": "3"}],
            )
            with pytest.raises(
                openai.BadRequestError,
                match="previous_response_id 'resp-gone' is not a response of this session",
            ):
                await client.responses.create(
                    model="m", previous_response_id="resp-gone", input="hi", max_output_tokens=4
                )
            return first, second

    first, second = asyncio.run(run())
    assert second.output_text == "The sum is 3" and second.previous_response_id == first.id
    wire = _export(tool_server.url, sid, key)
    assert list(wire) == [first.id, second.id] and wire[second.id]["parent_id"] == first.id
    assert wire[second.id]["messages"][0] == {"role": "user", "content": "What is 1 + 2?"}
    assert wire[second.id]["messages"][-1] == {
        "role": "tool",
        "content": "3",
        "tool_call_id": first.output[0].call_id,
    }


def test_responses_previous_response_id_on_tiny_model(local_server, tiny_tokenizer):
    sid, key = _session(local_server.url, "resp-prev-real")

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{local_server.url}/v1", api_key=key, max_retries=0
        ) as client:
            first = await client.responses.create(
                model="m", input="What is 1 + 2?", max_output_tokens=8, temperature=0
            )
            second = await client.responses.create(
                model="m",
                previous_response_id=first.id,
                input="Are you sure?",
                max_output_tokens=8,
                temperature=0,
            )
            return first, second

    first, second = asyncio.run(run())
    wire = _export(local_server.url, sid, key)
    _check_tokens(wire[second.id])
    assert wire[second.id]["parent_id"] == first.id
    prompt = tiny_tokenizer.decode(wire[second.id]["model_response"]["input_tokens"])
    assert prompt == (
        "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
        + first.output_text
        + "<|im_end|>\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_responses_on_tiny_model(local_server):
    sid, key = _session(local_server.url, "resp-real")

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{local_server.url}/v1", api_key=key, max_retries=0
        ) as client:
            return await client.responses.create(
                model="m", input="What is 1 + 2?", instructions="Add.", max_output_tokens=10
            )

    response = asyncio.run(run())
    assert response.usage.output_tokens > 0
    wire = _export(local_server.url, sid, key)
    _check_tokens(wire[response.id])
    assert wire[response.id]["messages"][0] == {"role": "system", "content": "Add."}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_n_choices_on_tiny_model(local_server, stream):
    """n=3 through the SDK (plain and streamed) on the real model: three choices, each exported
    as its own interaction with the engine's exact tokens; the SDK sees the usage of all three."""
    sid, key = _session(local_server.url, f"oai-n-{stream}")

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{local_server.url}/v1", api_key=key, max_retries=0
        ) as client:
            request = {
                "model": "m",
                "messages": [{"role": "user", "content": "What is 1 + 2?"}],
                "n": 3,
                "max_completion_tokens": 8,
                "temperature": 1.0,
            }
            if not stream:
                completion = await client.chat.completions.create(**request)
                return completion.id, [c.message.content for c in completion.choices], completion.usage
            texts, usage, cid = ["", "", ""], None, None
            async for chunk in await client.chat.completions.create(**request, stream=True):
                cid, usage = chunk.id, chunk.usage or usage
                for choice in chunk.choices:
                    texts[choice.index] += choice.delta.content or ""
            return cid, texts, usage

    cid, texts, usage = asyncio.run(run())
    wire = _export(local_server.url, sid, key)
    ids = [cid, f"{cid}-1", f"{cid}-2"]
    assert list(wire) == ids
    for iid, text in zip(ids, texts, strict=True):
        _check_tokens(wire[iid])
        assert wire[iid]["output_message_list"][0]["content"] == text
    assert usage.completion_tokens == sum(len(wire[i]["model_response"]["output_tokens"]) for i in ids)


def test_agents_sdk_streamed_run_on_the_responses_api_scripted(tool_server):
    """The OpenAI Agents SDK's default model (the Responses API), streamed: the SDK rebuilds each
    turn from our events, runs the tool, and its second call links to the first."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    sid, key = _session(tool_server.url, "resp-stream-agents")

    @function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return "3"

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{tool_server.url}/v1", api_key=key, max_retries=0) as client:
            agent = Agent(
                name="adder",
                instructions="Use the add tool.",
                tools=[add],
                model=OpenAIResponsesModel(model="m", openai_client=client),
                model_settings=ModelSettings(max_tokens=48),
            )
            result = Runner.run_streamed(agent, "What is 1 + 2?")
            kinds = [event.type async for event in result.stream_events()]
            return result.final_output, kinds

    final, kinds = asyncio.run(run())
    assert final == "The sum is 3" and "raw_response_event" in kinds
    wire = _export(tool_server.url, sid, key)
    first, second = wire
    assert wire[second]["parent_id"] == first
    assert wire[second]["messages"][-1]["role"] == "tool" and wire[second]["messages"][-1]["content"] == "3"


def test_responses_stream_on_tiny_model(local_server):
    sid, key = _session(local_server.url, "resp-stream-real")

    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{local_server.url}/v1", api_key=key, max_retries=0
        ) as client:
            async with client.responses.stream(
                model="m", input="What is 1 + 2?", max_output_tokens=8
            ) as stream:
                deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
                return "".join(deltas), await stream.get_final_response()

    text, final = asyncio.run(run())
    assert text == final.output_text
    wire = _export(local_server.url, sid, key)
    _check_tokens(wire[final.id])
    assert wire[final.id]["output_message_list"] == [{"role": "assistant", "content": text}]
    assert final.usage.output_tokens == len(wire[final.id]["model_response"]["output_tokens"])


def test_sdk_sees_errors_in_its_dialect(scripted_server):
    async def run():
        async with openai.AsyncOpenAI(
            base_url=f"{scripted_server.url}/v1", api_key="bogus-key-123", max_retries=0
        ) as c:
            with pytest.raises(openai.AuthenticationError, match="invalid or expired session API key"):
                await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        async with anthropic.AsyncAnthropic(
            base_url=scripted_server.url, api_key="bogus-key-123", max_retries=0
        ) as c:
            with pytest.raises(anthropic.AuthenticationError, match="invalid or expired session API key"):
                await c.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])

    asyncio.run(run())

"""Structured output through the proxy on the real model: the OpenAI SDK's `response_format`
json_schema (chat), `text.format` (Responses) and a forced `tool_choice` (chat and Anthropic
Messages) give parseable replies that match the schema; the schema is shown in the recorded prompt
and the recorded response knows the masked distribution each token came from."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from areal_nb.capture.structured import FORMAT_INSTRUCTION
from tests.proxy.hostile import new_session_key

pytestmark = pytest.mark.server

ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": False}
# bounded: tiny-math was never taught to call tools, and an unbounded integer can run to max_tokens
SMALL = {"type": "integer", "minimum": 0, "maximum": 999}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": SMALL, "b": SMALL}, "required": ["a", "b"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(local_server):
    with httpx.Client(base_url=local_server.url, timeout=60) as c:
        yield c


def _recorded(local_server, sid: str, iid: str):
    return local_server.app.state.proxy.sessions[sid].cache[iid]


def test_openai_sdk_json_schema_reply_parses_and_records_its_masks(local_server, client, tiny_tokenizer):
    import openai

    for _ in range(3):
        sid, key = new_session_key(client)
        sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
        completion = sdk.chat.completions.create(
            model="tiny-math", messages=[{"role": "user", "content": "What is 12 + 30?"}], max_tokens=80, temperature=1.0,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}},
        )
        reply = json.loads(completion.choices[0].message.content)
        jsonschema.validate(reply, ANSWER)
        interaction = _recorded(local_server, sid, completion.id)
        prompt_text = tiny_tokenizer.decode(interaction.model_response.input_tokens)
        assert FORMAT_INSTRUCTION + json.dumps(ANSWER) in prompt_text  # the model saw the schema
        assert interaction.messages == [{"role": "user", "content": "What is 12 + 30?"}]  # the caller's messages
        masks = interaction.model_response.sampling_masks
        assert masks.constraint.schema == ANSWER and len(masks.logprobs) == interaction.model_response.output_len


def test_responses_text_format_json_schema(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    response = sdk.responses.create(model="tiny-math", input="What is 2 + 2?", max_output_tokens=80,
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), ANSWER)


def test_forced_tool_choice_is_a_call_of_that_function(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    completion = sdk.chat.completions.create(
        model="tiny-math", messages=[{"role": "user", "content": "What is 3 + 5?"}], max_tokens=200, tools=[ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    assert completion.choices[0].message.tool_calls, completion.choices[0]
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "add" and completion.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), ADD["function"]["parameters"])


def test_anthropic_tool_choice_tool_is_a_tool_use_block(local_server, client):
    import anthropic

    _, key = new_session_key(client)
    sdk = anthropic.Anthropic(base_url=local_server.url, api_key=key)
    tool = {"name": "add", "description": "Add", "input_schema": ADD["function"]["parameters"]}
    message = sdk.messages.create(model="tiny-math", max_tokens=200, messages=[{"role": "user", "content": "3 + 5?"}],
                                  tools=[tool], tool_choice={"type": "tool", "name": "add"})
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "add"
    jsonschema.validate(use.input, tool["input_schema"])


def test_json_schema_and_forced_tool_together_are_a_400(local_server, client):
    _, key = new_session_key(client)
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": "tiny-math", "messages": [{"role": "user", "content": "hi"}], "tools": [ADD],
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}})
    assert r.status_code == 400 and "cannot both" in r.json()["error"]["message"]


def test_agents_sdk_output_type_gets_a_parsed_pydantic_object(local_server, client):
    import asyncio

    import openai
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, set_tracing_disabled
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        answer: int = Field(ge=0, le=9999)

    set_tracing_disabled(True)
    _, key = new_session_key(client)
    model = OpenAIChatCompletionsModel(model="tiny-math", openai_client=openai.AsyncOpenAI(base_url=local_server.url + "/v1", api_key=key))
    agent = Agent(name="math", instructions="Answer the question.", model=model, output_type=Answer)
    result = asyncio.run(Runner.run(agent, "What is 12 + 30?", run_config=RunConfig(tracing_disabled=True)))
    assert isinstance(result.final_output, Answer)

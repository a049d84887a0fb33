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
from tests.structured_tools import NUM, SAY, SCHEMAS

pytestmark = pytest.mark.server

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
# bounded: tiny-math was never taught to call tools, and an unbounded integer can run to max_tokens
SMALL = {"type": "integer", "minimum": 0, "maximum": 999}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": SMALL, "b": SMALL},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


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
            model="tiny-math",
            messages=[{"role": "user", "content": "What is 12 + 30?"}],
            max_tokens=80,
            temperature=1.0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
            },
        )
        reply = json.loads(completion.choices[0].message.content)
        jsonschema.validate(reply, ANSWER)
        interaction = _recorded(local_server, sid, completion.id)
        prompt_text = tiny_tokenizer.decode(interaction.model_response.input_tokens)
        assert FORMAT_INSTRUCTION + json.dumps(ANSWER) in prompt_text  # the model saw the schema
        assert interaction.messages == [
            {"role": "user", "content": "What is 12 + 30?"}
        ]  # the caller's messages
        masks = interaction.model_response.sampling_masks
        assert (
            masks.constraint.schema == ANSWER and len(masks.logprobs) == interaction.model_response.output_len
        )


def test_responses_text_format_json_schema(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    response = sdk.responses.create(
        model="tiny-math",
        input="What is 2 + 2?",
        max_output_tokens=80,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
    )
    jsonschema.validate(json.loads(response.output_text), ANSWER)


def test_forced_tool_choice_is_a_call_of_that_function(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    completion = sdk.chat.completions.create(
        model="tiny-math",
        messages=[{"role": "user", "content": "What is 3 + 5?"}],
        max_tokens=200,
        tools=[ADD],
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
    message = sdk.messages.create(
        model="tiny-math",
        max_tokens=200,
        messages=[{"role": "user", "content": "3 + 5?"}],
        tools=[tool],
        tool_choice={"type": "tool", "name": "add"},
    )
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "add"
    jsonschema.validate(use.input, tool["input_schema"])


def test_json_schema_and_forced_tool_together_are_a_400(local_server, client):
    _, key = new_session_key(client)
    r = client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny-math",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [ADD],
            "tool_choice": {"type": "function", "function": {"name": "add"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}},
        },
    )
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
    model = OpenAIChatCompletionsModel(
        model="tiny-math", openai_client=openai.AsyncOpenAI(base_url=local_server.url + "/v1", api_key=key)
    )
    agent = Agent(name="math", instructions="Answer the question.", model=model, output_type=Answer)
    result = asyncio.run(Runner.run(agent, "What is 12 + 30?", run_config=RunConfig(tracing_disabled=True)))
    assert isinstance(result.final_output, Answer)


# ---------------------------------------------------------------- any tool, regex and choice


def test_tool_choice_required_is_a_call_of_one_of_the_tools(local_server, client):
    import openai

    sid, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    for _ in range(3):
        completion = sdk.chat.completions.create(
            model="tiny-math",
            messages=[{"role": "user", "content": "What is 3 + 5?"}],
            max_tokens=80,
            tools=[SAY, NUM],
            tool_choice="required",
        )
        (call,) = completion.choices[0].message.tool_calls or [None]
        assert completion.choices[0].finish_reason == "tool_calls", completion.choices[0]
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        constraint = _recorded(local_server, sid, completion.id).model_response.sampling_masks.constraint
        assert constraint.kind == "any_tool_call" and constraint.functions == SCHEMAS


def test_responses_tool_choice_required_is_a_function_call_item(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    response = sdk.responses.create(
        model="tiny-math",
        input="What is 3 + 5?",
        max_output_tokens=80,
        tools=[{"type": "function", **tool["function"]} for tool in (SAY, NUM)],
        tool_choice="required",
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_anthropic_tool_choice_any_is_a_tool_use_block(local_server, client):
    import anthropic

    _, key = new_session_key(client)
    sdk = anthropic.Anthropic(base_url=local_server.url, api_key=key)
    tools = [{"name": name, "description": name, "input_schema": schema} for name, schema in SCHEMAS.items()]
    message = sdk.messages.create(
        model="tiny-math",
        max_tokens=80,
        messages=[{"role": "user", "content": "3 + 5?"}],
        tools=tools,
        tool_choice={"type": "any"},
    )
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use"
    jsonschema.validate(use.input, SCHEMAS[use.name])


def test_anthropic_output_format_gets_a_parsed_object(local_server, client):
    import anthropic
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        answer: int = Field(ge=0, le=999)

    sid, key = new_session_key(client)
    sdk = anthropic.Anthropic(base_url=local_server.url, api_key=key)
    message = sdk.messages.parse(
        model="tiny-math",
        max_tokens=80,
        messages=[{"role": "user", "content": "What is 12 + 30?"}],
        output_format=Answer,
    )
    assert isinstance(message.parsed_output, Answer)
    interaction = _recorded(local_server, sid, message.id)
    assert interaction.model_response.sampling_masks.constraint.kind == "json_schema"


@pytest.mark.parametrize(
    ("extra_body", "kind", "check"),
    [
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", lambda t: t in ("yes", "no")),
        ({"guided_choice": ["left", "right"]}, "choice", lambda t: t in ("left", "right")),
        ({"structured_outputs": {"regex": "[0-9]{1,3}"}}, "regex", str.isdigit),
        ({"guided_regex": "(yes|no), [a-z]{2,5}"}, "regex", lambda t: t.split(", ")[0] in ("yes", "no")),
        (
            {"regex": "[A-Z][a-z]{0,6}"},
            "regex",
            lambda t: t[:1].isupper() and t[1:].islower() | (t[1:] == ""),
        ),
        ({"guided_json": ANSWER}, "json_schema", lambda t: set(json.loads(t)) == {"answer"}),
    ],
    ids=[
        "vllm-choice",
        "vllm-guided-choice",
        "vllm-regex",
        "vllm-guided-regex",
        "sglang-regex",
        "guided-json",
    ],
)
def test_regex_and_choice_where_vllm_and_sglang_clients_send_them(
    local_server, client, extra_body, kind, check
):
    import openai

    sid, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    completion = sdk.chat.completions.create(
        model="tiny-math",
        messages=[{"role": "user", "content": "Is 3 + 5 = 8?"}],
        max_tokens=40,
        extra_body=extra_body,
    )
    text = completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop" and check(text), text
    masks = _recorded(local_server, sid, completion.id).model_response.sampling_masks
    assert masks.constraint.kind == kind


def test_responses_take_the_same_choice_option(local_server, client):
    import openai

    _, key = new_session_key(client)
    sdk = openai.OpenAI(base_url=local_server.url + "/v1", api_key=key)
    response = sdk.responses.create(
        model="tiny-math",
        input="Is 3 + 5 = 8?",
        max_output_tokens=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert response.output_text in ("yes", "no")


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        (
            "/v1/chat/completions",
            {
                "tools": [
                    ADD,
                    {
                        **SAY,
                        "function": {
                            **SAY["function"],
                            "parameters": {"type": "array", "uniqueItems": True},
                        },
                    },
                ],
                "tool_choice": "required",
            },
            ["tool 'say'", "uniqueItems"],
        ),
        ("/v1/chat/completions", {"guided_grammar": "root ::= 'a'"}, ["guided_grammar", "not supported"]),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"grammar": "start: 'a'"}},
            ["structured_outputs.grammar"],
        ),
        ("/v1/chat/completions", {"regex": "(?=a)b"}, ["regex", "look-around"]),
        ("/v1/chat/completions", {"guided_choice": []}, ["guided_choice", "non-empty list"]),
        (
            "/v1/chat/completions",
            {"guided_regex": "[0-9]+", "response_format": {"type": "json_object"}},
            ["response_format and guided_regex cannot both"],
        ),
        (
            "/v1/responses",
            {"text": {"format": {"type": "json_object"}}, "guided_choice": ["a"]},
            ["text.format and guided_choice"],
        ),
        (
            "/v1/messages",
            {"output_config": {"format": {"type": "json_schema", "schema": {"not": {}}}}},
            ["not"],
        ),
        ("/v1/messages", {"output_config": {"format": {"type": "xml"}}}, ["output_config.format must be"]),
    ],
    ids=[
        "required-tool-schema",
        "grammar",
        "structured-grammar",
        "lookaround",
        "empty-choice",
        "two-sources",
        "responses-two",
        "anthropic-not",
        "anthropic-xml",
    ],
)
def test_unsupported_constraints_are_400s_that_name_them(client, path, body, named):
    _, key = new_session_key(client)
    if path == "/v1/responses":
        request = {"model": "tiny-math", "input": "hi", **body}
    elif path == "/v1/messages":
        request = {
            "model": "tiny-math",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            **body,
        }
    else:
        request = {"model": "tiny-math", "messages": [{"role": "user", "content": "hi"}], **body}
    r = client.post(path, headers={"Authorization": f"Bearer {key}"}, json=request)
    assert r.status_code == 400, r.text
    message = json.dumps(r.json())
    for part in named:
        assert part in message, message

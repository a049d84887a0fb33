"""The proxy's prompts on a real model's template: SmolLM2-135M-Instruct (ChatML, a default system
prompt when none is given, no tool syntax), loaded from its GGUF file.

Every door (chat completions, Responses, Anthropic Messages) records exactly the tokens of
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`, for one and several turns,
with and without a system message; the `concat` rule reuses a parent's exact tokens on this
template; and tools, which this template cannot render, are shown in the system message.

Real uvicorn servers on loopback and the real SDKs; the tokenizer is SmolLM2's own, the replies
are scripted (what the model says does not matter to a prompt; the real model generates in
test_smollm2_training.py).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from areal_nb.capture.completion import CompletionSettings
from areal_nb.capture.tool_specs import TOOLS_SECTION_START, with_tools_section
from areal_nb.models import load_tokenizer
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, session_headers, start_session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.server,
    pytest.mark.filterwarnings("ignore::areal_nb.errors.MissingRewardWarning"),  # no rewards here
]

SYSTEM = "You are a terse arithmetic tutor."
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TURNS = [
    {"role": "user", "content": "What is 12 times 34?"},
    {"role": "assistant", "content": "12 times 34 is 408."},
    {"role": "user", "content": "And 13 times 34?"},
]
CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
TOOLS = [{"type": "function", "function": CALCULATOR}]


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    gguf, _ = smollm2
    return load_tokenizer(str(gguf))


def rendered(tokenizer, messages, **kwargs) -> list[int]:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )


def serve(tokenizer, script, template: str):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    settings = ProxySettings(
        admin_api_key=PROXY_ADMIN_KEY, completion=CompletionSettings(chat_template_type=template)
    )
    return ProxyServer(create_app(ScriptedEngine(tokenizer, script), tokenizer, settings))


@pytest.fixture(scope="module")
def hf_server(tokenizer):
    with serve(tokenizer, "408.", "hf") as running:
        yield running


def recorded(http: httpx.Client, sid: str, key: str) -> list[dict]:
    """The session's interactions as exported, in the order they were made."""
    assert http.post("/rl/end_session", headers=session_headers(key)).status_code == 200
    exported = http.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert exported.status_code == 200, exported.text
    return list(exported.json()["interactions"].values())


def call_door(door: str, url: str, key: str, system: str | None, turns: list[dict], **extra) -> None:
    if door == "chat":
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        client.chat.completions.create(model="m", messages=messages, max_tokens=8, **extra)
    elif door == "responses":
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        client.responses.create(
            model="m",
            input=turns,
            max_output_tokens=8,
            **({"instructions": system} if system else {}),
            **extra,
        )
    else:
        client_a = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        client_a.messages.create(
            model="m", max_tokens=8, messages=turns, **({"system": system} if system else {}), **extra
        )


@pytest.mark.parametrize("system", [None, SYSTEM], ids=["default-system", "own-system"])
@pytest.mark.parametrize("n_turns", [1, 3], ids=["one-turn", "three-turns"])
@pytest.mark.parametrize("door", ["chat", "responses", "anthropic"])
def test_every_door_records_the_templates_own_tokens(hf_server, tokenizer, door, n_turns, system):
    turns = TURNS[:n_turns]
    with httpx.Client(base_url=hf_server.url) as http:
        sid, key = start_session(http, door)
        call_door(door, hf_server.url, key, system, turns)
        (interaction,) = recorded(http, sid, key)
    expected = rendered(tokenizer, ([{"role": "system", "content": system}] if system else []) + turns)
    assert interaction["model_response"]["input_tokens"] == expected
    text = tokenizer.decode(expected)
    assert text.startswith(f"<|im_start|>system\n{system or DEFAULT_SYSTEM}<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_start|>") == n_turns + 2


def test_concat_reuses_the_parents_exact_tokens_on_this_template(tokenizer):
    # the reply spelled one character per token: its text re-encodes to other tokens, so a
    # re-render of the conversation differs from what the engine produced
    reply = [t for c in "12 times 34 is 408." for t in tokenizer.encode(c, add_special_tokens=False)]
    assert tokenizer.encode("12 times 34 is 408.", add_special_tokens=False) != reply
    with (
        serve(tokenizer, reply + [tokenizer.eos_token_id], "concat") as running,
        httpx.Client(base_url=running.url) as http,
    ):
        sid, key = start_session(http, "concat")
        client = openai.OpenAI(base_url=running.url + "/v1", api_key=key, max_retries=0)
        messages: list = [TURNS[0]]
        first = client.chat.completions.create(model="m", messages=messages, max_tokens=32)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, TURNS[2]]
        client.chat.completions.create(model="m", messages=messages, max_tokens=32)
        parent, child = recorded(http, sid, key)
    parent_tokens = parent["model_response"]["input_tokens"] + reply + [tokenizer.eos_token_id]
    child_prompt = child["model_response"]["input_tokens"]
    assert parent["model_response"]["input_tokens"] == rendered(tokenizer, [TURNS[0]])  # a root renders whole
    assert (
        child_prompt[: len(parent_tokens)] == parent_tokens
    )  # the parent's exact tokens, its reply included
    whole = rendered(tokenizer, messages)
    assert child_prompt != whole  # a re-render would have re-tokenized the reply
    # what follows the parent is the template's own rendering of the new turn
    suffix = tokenizer.decode(child_prompt[len(parent_tokens) :])
    assert suffix == "\n<|im_start|>user\nAnd 13 times 34?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(child_prompt) == tokenizer.decode(whole)  # same text, other tokens


TOOL_REPLY = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'


@pytest.mark.parametrize("door", ["chat", "responses", "anthropic"])
def test_tools_a_template_cannot_render_are_shown_in_the_system_message(tokenizer, door):
    assert "tools" not in tokenizer.chat_template  # SmolLM2's template drops them
    with serve(tokenizer, TOOL_REPLY, "hf") as running, httpx.Client(base_url=running.url) as http:
        sid, key = start_session(http, door)
        tools = (
            [
                {
                    "name": CALCULATOR["name"],
                    "description": CALCULATOR["description"],
                    "input_schema": CALCULATOR["parameters"],
                }
            ]
            if door == "anthropic"
            else [{"type": "function", **CALCULATOR}]
            if door == "responses"
            else TOOLS
        )
        call_door(door, running.url, key, SYSTEM, TURNS[:1], tools=tools)
        (interaction,) = recorded(http, sid, key)
    prompt = interaction["model_response"]["input_tokens"]
    shown = with_tools_section([{"role": "system", "content": SYSTEM}, TURNS[0]], TOOLS)
    assert prompt == rendered(tokenizer, shown)
    text = tokenizer.decode(prompt)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}\n\n{TOOLS_SECTION_START}\n{json.dumps(TOOLS[0])}")
    assert prompt != rendered(tokenizer, [{"role": "system", "content": SYSTEM}, TURNS[0]], tools=TOOLS)


def test_a_tool_call_round_trip_on_a_template_without_tool_syntax(tokenizer):
    with serve(tokenizer, TOOL_REPLY, "hf") as running, httpx.Client(base_url=running.url) as http:
        sid, key = start_session(http, "tool-round-trip")
        client = openai.OpenAI(base_url=running.url + "/v1", api_key=key, max_retries=0)
        messages: list = [TURNS[0]]  # no system message: the tools section is the system message
        first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=64)
        (call,) = first.choices[0].message.tool_calls  # parsed back from the text the model was shown
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "calculator",
            {"expression": "12*34"},
        )
        assert first.choices[0].finish_reason == "tool_calls"
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "408"},
        ]
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=64)
        _, second = recorded(http, sid, key)
    text = tokenizer.decode(second["model_response"]["input_tokens"])
    assert text.startswith(f"<|im_start|>system\n{TOOLS_SECTION_START}")  # not SmolLM2's default
    assert (
        "<|im_start|>user\nWhat is 12 times 34?<|im_end|>\n"
        f"<|im_start|>assistant\n{TOOL_REPLY}<|im_end|>\n"  # the call as the model wrote it
        "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    ) in text

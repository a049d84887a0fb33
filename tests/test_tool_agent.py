"""The tool task and its agent: the model's tool calls are executed and their results sent back.

A ScriptedEngine plays a model that calls the calculator (the exact reply is needed); the proxy,
the OpenAI SDK, the tool-call parser and the workflow are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from areal_nb.agents.tool_agent import ToolAgent
from areal_nb.data.tool_task import answer_reward, calculator, generate_tool_problems
from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

ROW = generate_tool_problems(1, seed=3)[0]


def test_the_calculator_evaluates_integer_arithmetic_and_reports_errors():
    assert calculator("37*48") == "1776" and calculator("2 + 3 * 4") == "14" and calculator("5-9") == "-4"
    assert calculator("2**64").startswith("error:")  # no power: nothing can blow up
    assert calculator("__import__('os')").startswith("error:")
    assert calculator("1.5*2").startswith("error:") and calculator("1 +").startswith("error:")


def test_generated_problems_are_seeded_and_need_a_product():
    rows = generate_tool_problems(50, seed=0)
    assert rows == generate_tool_problems(50, seed=0)
    assert rows != generate_tool_problems(50, split="test") != generate_tool_problems(50, seed=1)
    for r in rows:
        assert calculator(r["expression"]) == r["answer"] and 121 <= int(r["answer"]) <= 9801
    assert answer_reward(ROW, f"It is {ROW['answer']}.") == 1.0
    assert answer_reward(ROW, f"{ROW['answer']} ... no, 12") == 0.0 and answer_reward(ROW, "") == 0.0


@pytest.mark.server
def test_the_agent_calls_the_tool_and_answers_with_its_result(tiny_tokenizer):
    def model(req):
        prompt = tiny_tokenizer.decode(req.input_ids)
        result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", prompt)
        if result:
            return f"The answer is {result.group(1)}."
        return (
            "<tool_call>\n"
            + json.dumps({"name": "calculator", "arguments": {"expression": ROW["expression"]}})
            + "\n</tool_call>"
        )

    engine = ScriptedEngine(tiny_tokenizer, model)
    with serve_proxy(engine, tiny_tokenizer) as proxy:
        wf = OpenAIProxyWorkflow(
            agent=ToolAgent(), proxy_addr=proxy.url, admin_api_key=ADMIN_KEY, discount=0.9
        )
        out = asyncio.run(wf.arun_episode(None, ROW))
        assert wf.last_rejection_reason is None, wf.last_rejection_reason
        first, second = out.values()
        # turn 1: the tool is offered in the prompt and the model's call is parsed into tool_calls
        prompt = tiny_tokenizer.decode(first.model_response.input_tokens)
        assert "<tools>" in prompt and '"calculator"' in prompt
        call = first.output_message_list[0]["tool_calls"][0]["function"]
        assert call["name"] == "calculator" and ROW["expression"] in call["arguments"]
        # turn 2 is the child of turn 1 and saw the tool's result
        assert second.parent is first
        assert second.messages[-1] == {
            "role": "tool",
            "tool_call_id": first.output_message_list[0]["tool_calls"][0]["id"],
            "content": ROW["answer"],
        }
        assert second.output_message_list[0]["content"] == f"The answer is {ROW['answer']}."
        # the answer's reward, discounted back over the tool turn
        assert second.reward == 1.0 and first.reward == pytest.approx(0.9)
        assert len(engine.requests) == 2 and live_sessions(proxy.app) == ({}, {})


@pytest.mark.server
def test_a_wrong_or_missing_tool_call_is_answered_not_raised(tiny_tokenizer):
    replies = iter(['<tool_call>\n{"name": "abacus", "arguments": {}}\n</tool_call>', "The answer is 12."])
    engine = ScriptedEngine(tiny_tokenizer, lambda req: next(replies))
    with serve_proxy(engine, tiny_tokenizer) as proxy:
        wf = OpenAIProxyWorkflow(agent=ToolAgent(), proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)
        out = asyncio.run(wf.arun_episode(None, ROW))
        first, second = out.values()
        assert second.messages[-1]["content"] == "error: no tool named 'abacus'"
        assert second.reward == 0.0


# ----------------------------------------------------------------------------- your own tools

LOOKUP_SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Population of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
POPULATION = {"Oslo": 709_000}


def lookup(city):
    return {"city": city, "population": POPULATION[city]}  # KeyError for a city it does not know


async def async_lookup(city):
    await asyncio.sleep(0)
    return lookup(city)


def tool_episode(tiny_tokenizer, agent, city: str):
    """(the tool message the model got back, the answer's reward) for one episode calling lookup(city)."""
    replies = iter(
        [
            "<tool_call>\n" + json.dumps({"name": "lookup", "arguments": {"city": city}}) + "\n</tool_call>",
            "It has 709000 people.",
        ]
    )
    engine = ScriptedEngine(tiny_tokenizer, lambda req: next(replies))
    row = {"messages": [{"role": "user", "content": f"How many people live in {city}?"}], "answer": "709000"}
    with serve_proxy(engine, tiny_tokenizer) as proxy:
        wf = OpenAIProxyWorkflow(agent=agent, proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)
        out = asyncio.run(wf.arun_episode(None, row))
        assert wf.last_rejection_reason is None, wf.last_rejection_reason
        first, second = out.values()
        return second.messages[-1], second.reward


@pytest.mark.server
@pytest.mark.parametrize("fn", [lookup, async_lookup])
def test_your_own_sync_or_async_tool_returns_json_to_the_model(tiny_tokenizer, fn):
    agent = ToolAgent(tools={"lookup": (LOOKUP_SCHEMA, fn)})
    message, reward = tool_episode(tiny_tokenizer, agent, "Oslo")
    assert message["role"] == "tool" and message["content"] == '{"city": "Oslo", "population": 709000}'
    assert reward == 1.0


@pytest.mark.server
@pytest.mark.parametrize("fn", [lookup, async_lookup])
def test_a_tool_that_raises_tells_the_model_and_the_episode_still_trains(tiny_tokenizer, fn):
    # a rejected episode would drop exactly the signal RL needs: a call that went wrong earns its reward
    agent = ToolAgent(tools={"lookup": (LOOKUP_SCHEMA, fn)})
    message, reward = tool_episode(tiny_tokenizer, agent, "Atlantis")
    assert message["content"] == "error: lookup raised KeyError: 'Atlantis'"
    assert reward == 1.0  # the scripted answer still names the row's number


def test_call_tool_reports_bad_arguments_and_refuses_an_async_tool_it_cannot_await():
    agent = ToolAgent(tools={"lookup": (LOOKUP_SCHEMA, lookup), "alookup": (LOOKUP_SCHEMA, async_lookup)})
    assert agent.call_tool("lookup", '{"city": "Oslo"}') == '{"city": "Oslo", "population": 709000}'
    assert agent.call_tool("lookup", '["Oslo"]').startswith("error: bad arguments for lookup")
    assert agent.call_tool("lookup", "{not json").startswith("error: bad arguments for lookup")
    assert (
        asyncio.run(agent.acall_tool("alookup", '{"city": "Oslo"}'))
        == '{"city": "Oslo", "population": 709000}'
    )
    with pytest.raises(TypeError, match="'alookup' is async: use `await agent.acall_tool"):
        agent.call_tool("alookup", '{"city": "Oslo"}')

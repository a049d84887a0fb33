"""Tool agents written against each door train: the calculator task on the built-in `tiny-tools`
model, with the agent using the OpenAI Responses API or the Anthropic Messages API instead of
chat completions (`tests/test_tool_task.py` covers the built-in chat-completions ToolAgent).

The model emits `<tool_call>` text itself; each door must hand it to the agent as that SDK's tool
call (a `function_call` item, a `tool_use` block), take the result back (`function_call_output`,
`tool_result`), link the answer under the call, and train on both turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_nb import Session
from areal_nb.config import load_config
from areal_nb.data.tool_task import CALCULATOR_TOOL, answer_reward, calculator
from areal_nb.widgets.tree_model import build_tree

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tool_use.yaml"
SMALL = [
    "rollout.batch_size=4",
    "rollout.group_size=2",
    "data.eval_size=8",
    "logging.eval_every=0",
    "logging.progress=false",
]
FUNCTION = CALCULATOR_TOOL["function"]


class ResponsesCalculatorAgent:
    async def run(self, data, base_url, api_key, http_client=None, **_):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        tools = [{"type": "function", **FUNCTION}]
        items = [{"role": "user", "content": data["messages"][0]["content"]}]
        for _turn in range(2):
            response = await client.responses.create(model="m", input=items, tools=tools)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return answer_reward(data, response.output_text)
            # the whole output goes back, as Responses agents do (text the model wrote before its call included)
            items += [item.model_dump(exclude_none=True) for item in response.output]
            for call in calls:
                expression = json.loads(call.arguments).get("expression", "")
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.call_id,
                        "output": calculator(expression),
                    }
                )
        return 0.0


class AnthropicCalculatorAgent:
    async def run(self, data, base_url, api_key, **_):
        from anthropic import AsyncAnthropic

        client = AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key, max_retries=0)
        tools = [
            {
                "name": FUNCTION["name"],
                "description": FUNCTION["description"],
                "input_schema": FUNCTION["parameters"],
            }
        ]
        messages = [{"role": "user", "content": data["messages"][0]["content"]}]
        for _turn in range(2):
            reply = await client.messages.create(model="m", max_tokens=24, messages=messages, tools=tools)
            uses = [block for block in reply.content if block.type == "tool_use"]
            if not uses:
                return answer_reward(data, "".join(b.text for b in reply.content if b.type == "text"))
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": calculator(use.input.get("expression", "")),
                        }
                        for use in uses
                    ],
                },
            ]
        return 0.0


@pytest.mark.parametrize("agent_class", [ResponsesCalculatorAgent, AnthropicCalculatorAgent])
def test_a_tool_agent_trains_through_its_own_door(agent_class):
    with Session(load_config(CONFIG, SMALL), agent__workflow=agent_class()) as s:
        tool_turns = 0
        for _ in range(2):
            batch = s.rollout()
            assert not batch.rejected, s.executor.rejection_reasons
            for i in range(len(batch.episodes)):
                calls = batch.calls(i)
                if len(calls) != 2:
                    continue
                tool_turns += 1
                call, answer = calls
                tool_call = call.output_message_list[0]["tool_calls"][0]
                assert answer.parent is call and tool_call["function"]["name"] == "calculator"
                result = answer.messages[-1]
                assert result["role"] == "tool" and result["tool_call_id"] == tool_call["id"]
                assert result["content"] == calculator(
                    json.loads(tool_call["function"]["arguments"])["expression"]
                )
                # the reward (set on the answer) is discounted back onto the tool call by the batch
                assert batch.discounted(i)[call.interaction_id] == pytest.approx(0.9 * answer.reward)
            tree = build_tree(batch)
            assert len([n for n in tree.nodes if "tool" in n.roles.split(",")]) == sum(
                len(batch.calls(i)) == 2 for i in range(len(batch.episodes))
            )
            s.train_step(batch)
        assert tool_turns > 0, "the model called the calculator in none of 16 episodes"
        assert s.version == 2
        result = s.evaluate()
        assert result.n == 8 and result.rejected == 0 and 0.0 <= result.reward_mean <= 1.0

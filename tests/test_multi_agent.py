"""Several agents in one episode, through the real proxy app in-process (no socket), the real
OpenAI and Anthropic SDKs and a scripted model, so each reply is exactly known: every call is
tagged with the agent that made it (the `model` name it sent), agents' calls never link into one
another's trees, the tag survives the wire, and the solver-checker example rewards each part."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal_nb.agents import SolverCheckerAgent
from areal_nb.agents.solver_checker import checker_reward, final_number
from areal_nb.capture import InteractionWithTokenLogpReward
from areal_nb.testing import ScriptedEngine
from tests import scripted_episode

QUESTION = scripted_episode.QUESTION


def run_episode(tokenizer, agent: Any, replies: list[str], data: dict[str, Any] = QUESTION):
    return scripted_episode.run_episode(tokenizer, agent, replies, data, discount=1.0)


class ThreeDoorsAgent:
    """A planner on chat completions, a critic on the Responses API, a writer on Anthropic's
    Messages (a plain POST: this anthropic release refuses the episode's httpx client); the
    critic and the writer are shown the planner's whole conversation."""

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from openai import AsyncOpenAI

        oai = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        plan = await oai.chat.completions.create(model="planner", messages=data["messages"], max_tokens=8)
        history = data["messages"] + [plan.choices[0].message.model_dump(exclude_none=True)]
        critique = await oai.responses.create(
            model="critic", input=history + [{"role": "user", "content": "ok?"}], max_output_tokens=8
        )
        written = await http_client.post(
            f"{base_url}/messages",
            headers={"x-api-key": api_key, "anthropic-version": "2023-06-01"},
            json={
                "model": "writer",
                "max_tokens": 8,
                "messages": [*history, {"role": "user", "content": "write it up"}],
            },
        )
        assert written.status_code == 200, written.text
        return {plan.id: 1.0, critique.id: 0.5, written.json()["id"]: 0.25}


def test_each_door_tags_the_call_with_its_model_name_and_agents_never_share_a_tree(tiny_tokenizer):
    calls, _ = run_episode(tiny_tokenizer, ThreeDoorsAgent(), ["plan", "fine", "done"])
    assert [c.agent for c in calls] == ["planner", "critic", "writer"]
    # the critic's and the writer's messages start with the planner's conversation, but a call's
    # parent is only ever a call of its own agent: three roots, and the rewards stay where set
    assert [c.parent for c in calls] == [None, None, None]
    assert [c.reward for c in calls] == [1.0, 0.5, 0.25]


def test_one_agents_turns_still_link_into_its_own_tree(tiny_tokenizer):
    class TwoTurns:
        async def run(self, data, base_url, api_key, http_client=None, **_):
            from openai import AsyncOpenAI

            oai = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
            first = await oai.chat.completions.create(model="solver", messages=data["messages"])
            other = await oai.chat.completions.create(model="checker", messages=data["messages"])
            messages = data["messages"] + [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "again"},
            ]
            second = await oai.chat.completions.create(model="solver", messages=messages)
            return {first.id: 0.0, other.id: 1.0, second.id: 1.0}

    first, other, second = run_episode(tiny_tokenizer, TwoTurns(), ["5", "4", "4"])[0]
    assert second.parent is first and other.parent is None
    assert first.reward == 1.0  # the solver's second turn's reward flowed back (γ = 1), not the checker's


def test_the_agent_tag_survives_the_wire():
    it = InteractionWithTokenLogpReward(
        messages=[{"role": "user", "content": "q"}],
        output_message_list=[{"role": "assistant", "content": "a"}],
        agent="checker",
        _interaction_id="x",
    )
    assert InteractionWithTokenLogpReward.from_wire(it.to_wire()).agent == "checker"


@pytest.fixture(scope="module")
def solver_checker():
    """One agent for the four episodes below: its reward worker pool starts once."""
    agent = SolverCheckerAgent()
    yield agent
    agent.close()


@pytest.mark.parametrize(
    ("solver", "checker", "rewards"),
    [
        ("The sum is 4. #### 4", "#### 4", [1.0, 1.0]),  # right answer, agreed with
        ("The sum is 5. #### 5", "2 + 2 = 4 \\boxed{4}", [0.0, 1.0]),  # wrong answer caught
        ("The sum is 5. #### 5", "#### 5", [0.0, 0.0]),  # wrong answer missed
        ("The sum is 4. #### 4", "#### 7", [1.0, 0.0]),  # false alarm
    ],
)
def test_the_solver_checker_agent_rewards_each_part(tiny_tokenizer, solver_checker, solver, checker, rewards):
    calls, requests = run_episode(tiny_tokenizer, solver_checker, [solver, checker])
    assert [c.agent for c in calls] == ["solver", "checker"]
    assert [c.reward for c in calls] == rewards
    # the checker was shown the problem and the solver's answer
    checker_prompt = tiny_tokenizer.decode(requests[1].input_ids)
    assert "What is 2 + 2?" in checker_prompt and solver in checker_prompt


def test_the_checker_needs_a_final_number_to_agree():
    assert final_number("so 1,200 #### 1,200") == 1200.0 and final_number("no number") is None
    assert final_number("\\boxed{3} or rather \\boxed{ 4 }") == 4.0  # the last one counts
    assert checker_reward(True, "#### 4", "I think it is right") == 0.0  # no final number: no verdict
    assert checker_reward(False, "#### 5", "hmm") == 0.0  # a wrong answer is not caught by saying nothing
    assert checker_reward(False, "no answer", "\\boxed{4}") == 1.0  # nothing to agree with: caught
    assert checker_reward(True, "\\boxed{4}", "#### 4") == 1.0  # either way of writing it


def test_the_two_parts_need_two_names():
    with pytest.raises(ValueError, match="different names"):
        SolverCheckerAgent(solver="a", checker="a")


def test_the_direct_client_tags_its_calls_too(tiny_tokenizer):
    from areal_nb.capture import ArealOpenAI

    client = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "4"), tiny_tokenizer)
    question = [{"role": "user", "content": "What is 2 + 2?"}]

    async def run():
        solved = await client.chat.completions.create(model="solver", messages=question, max_tokens=4)
        history = question + [solved.choices[0].message.model_dump(exclude_none=True)]
        checked = await client.responses.create(model="checker", input=history, max_output_tokens=4)
        again = await client.chat.completions.create(
            model="solver", messages=history + [{"role": "user", "content": "sure?"}], max_tokens=4
        )
        return solved, checked, again

    solved, checked, again = asyncio.run(run())
    calls = client.cache
    assert [c.agent for c in calls.values()] == ["solver", "checker", "solver"]
    assert calls[checked.id].parent is None and calls[again.id].parent is calls[solved.id]


def test_a_model_that_is_not_a_name_is_refused_and_nothing_is_recorded(tiny_tokenizer):
    from areal_nb.capture import ArealOpenAI, CompletionRequestError

    client = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "4"), tiny_tokenizer)
    with pytest.raises(CompletionRequestError, match="model must be a string"):
        asyncio.run(
            client.chat.completions.create(
                model=3, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        )
    assert len(client.cache) == 0

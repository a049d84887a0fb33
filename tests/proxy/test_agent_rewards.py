"""`AgentRewards({agent: reward})`: an agent returns each agent's episode reward; each lands on that
agent's most recently completed call and the discount carries it back through that agent's own
turns only. Over HTTP (a real proxy) and in process; `/rl/set_reward` with `agent` directly."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from areal_nb.api import AgentRewards
from areal_nb.rollout.workflow import EpisodeRejected, OpenAIProxyWorkflow, parse_agent_rewards
from areal_nb.testing import ScriptedEngine
from tests.proxy.agents import ADMIN_KEY, serve_proxy
from tests.proxy.conftest import session_headers, start_session

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


class TwoAgents:
    """Agent "a" answers and answers again after a follow-up (two linked turns); agent "b"
    answers once; returns `data["rewards"]` as AgentRewards."""

    async def run(self, data: dict[str, Any], **kw: Any) -> AgentRewards:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0
        )
        first = await client.chat.completions.create(model="a", messages=QUESTION, max_tokens=8)
        follow_up = [
            *QUESTION,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Are you sure?"},
        ]
        await client.chat.completions.create(model="a", messages=follow_up, max_tokens=8)
        await client.chat.completions.create(model="b", messages=QUESTION, max_tokens=8)
        return AgentRewards(data["rewards"])


def _rewards_by_agent(interactions: dict[str, Any]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for interaction in sorted(interactions.values(), key=lambda i: i.created_at):
        out.setdefault(interaction.agent, []).append(interaction.reward)
    return out


def test_agent_rewards_are_checked_like_other_rewards():
    out = parse_agent_rewards(AgentRewards({"a": np.float32(0.5), "b": 1}))
    assert out == AgentRewards({"a": 0.5, "b": 1.0}) and all(type(v) is float for v in out.per_agent.values())
    for bad in (
        AgentRewards({}),
        AgentRewards({"a": math.nan}),
        AgentRewards({"a": True}),
        AgentRewards({1: 1.0}),
    ):
        with pytest.raises(EpisodeRejected) as err:
            parse_agent_rewards(bad)
        assert err.value.kind == "invalid_reward"


@pytest.mark.parametrize(
    "in_process",
    [pytest.param(False, id="http", marks=pytest.mark.server), pytest.param(True, id="in-process")],
)
def test_each_agents_reward_lands_on_its_own_last_call_and_discounts_through_its_turns(
    tiny_tokenizer, make_app, in_process
):
    engine = ScriptedEngine(tiny_tokenizer, "4")

    async def episode(proxy_addr: str, app: Any = None, rewards: dict[str, float] | None = None) -> Any:
        workflow = OpenAIProxyWorkflow(
            agent=TwoAgents(),
            proxy_addr=proxy_addr,
            admin_api_key=ADMIN_KEY,
            discount=0.5,
            **({"asgi_app": app} if app is not None else {}),
        )
        try:
            result = await workflow.arun_episode(None, {"rewards": rewards or {"a": 1.0, "b": 0.25}})
            return result, workflow.last_rejection_reason
        finally:
            await workflow.aclose()

    if in_process:
        app = make_app(engine, admin_api_key=ADMIN_KEY)
        run = lambda **kw: asyncio.run(episode("http://proxy.invalid:9", app, **kw))  # noqa: E731
        interactions, reason = run()
        rejected, why = run(rewards={"a": 1.0, "nobody": 1.0})
    else:
        with serve_proxy(engine, tiny_tokenizer) as proxy:
            interactions, reason = asyncio.run(episode(proxy.url))
            rejected, why = asyncio.run(episode(proxy.url, rewards={"a": 1.0, "nobody": 1.0}))
    assert reason is None, reason
    # a's last call takes 1.0 and its first (its parent) the discounted 0.5; b's one call 0.25
    assert _rewards_by_agent(interactions) == {"a": [0.5, 1.0], "b": [0.25]}
    # a reward for an agent that made no call rejects the episode, naming the agents that did
    assert rejected is None and why.startswith("invalid_reward: ") and "'nobody'" in why and "a, b" in why


def test_set_reward_by_agent_over_http(make_app, tiny_tokenizer):
    with TestClient(make_app(ScriptedEngine(tiny_tokenizer, "4"))) as client:
        _, key = start_session(client)
        headers = session_headers(key)
        ids = {}
        for agent in ("a", "b", "a"):
            reply = client.post(
                "/v1/chat/completions",
                headers=headers,
                json={"model": agent, "messages": [{"role": "user", "content": f"hi {len(ids)}"}]},
            )
            assert reply.status_code == 200, reply.text
            ids.setdefault(agent, []).append(reply.json()["id"])
        assert (
            client.post("/rl/set_reward", headers=headers, json={"agent": "a", "reward": 0.75}).status_code
            == 200
        )
        both = client.post(
            "/rl/set_reward", headers=headers, json={"agent": "a", "interaction_id": ids["a"][0], "reward": 1}
        )
        assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
        nobody = client.post("/rl/set_reward", headers=headers, json={"agent": "c", "reward": 1})
        assert nobody.status_code == 400 and "'c' has no completed call" in nobody.json()["error"]["message"]
        sessions = client.app.state.proxy.sessions
        (session,) = sessions.values()
        assert session.cache[ids["a"][1]].reward == 0.75  # a's last call, not its first, not b's
        assert session.cache[ids["a"][0]].reward is None and session.cache[ids["b"][0]].reward is None

"""Load: many concurrent agent sessions through one proxy; nothing lost, duplicated or leaked."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine
from tests.proxy import agents
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

pytestmark = pytest.mark.slow


async def _run_many(workflow: OpenAIProxyWorkflow, n: int) -> list:
    episodes = [
        workflow.arun_episode(None, {"messages": [{"role": "user", "content": f"question {i}"}]})
        for i in range(n)
    ]
    results = await asyncio.gather(*episodes)
    await workflow.aclose()
    return results


def _check_all_exported_once(agent: agents.ChatAgent, results: list, sessions: int, turns: int) -> None:
    assert all(r is not None for r in results)
    exported = [iid for r in results for iid in r]
    assert len(exported) == sessions * turns
    assert max(Counter(exported).values()) == 1  # none duplicated
    assert set(exported) == {cid for cid, _ in agent.seen}  # none lost
    for result in results:
        chain = list(result.values())
        assert len(chain) == turns
        # each episode is its own linear conversation: turn k's parent is turn k-1
        assert [c.parent for c in chain[1:]] == chain[:-1]
        assert chain[0].parent is None
        # dict reward {turn k: k}, discount 1.0 over the chain
        assert [c.reward for c in chain] == [sum(range(k, turns + 1)) for k in range(1, turns + 1)]


def test_64_sessions_by_4_turns_scripted(tiny_tokenizer):
    sessions, turns = 64, 4
    engine = ScriptedEngine(tiny_tokenizer, "The answer is 7")
    agent = agents.ChatAgent(turns=turns)
    with serve_proxy(engine, tiny_tokenizer) as proxy:
        workflow = OpenAIProxyWorkflow(agent=agent, proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)
        results = asyncio.run(_run_many(workflow, sessions))
        _check_all_exported_once(agent, results, sessions, turns)
        assert len(engine.requests) == sessions * turns
        assert workflow.accepted == sessions and not workflow.rejections
        assert live_sessions(proxy.app) == ({}, {})  # no session or key left in memory
        assert proxy.state.capacity == 0  # every granted slot was used by its session


def test_8_sessions_by_2_turns_real_model(tiny_tokenizer, tiny_model_path):
    from areal_nb.engine import LocalEngine

    sessions, turns = 8, 2
    engine = LocalEngine(tiny_model_path, device="cpu", seed=1)
    agent = agents.ChatAgent(turns=turns, max_tokens=6)
    try:
        with serve_proxy(engine, tiny_tokenizer) as proxy:
            workflow = OpenAIProxyWorkflow(agent=agent, proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)
            results = asyncio.run(_run_many(workflow, sessions))
            _check_all_exported_once(agent, results, sessions, turns)
            assert live_sessions(proxy.app) == ({}, {})
    finally:
        engine.close()

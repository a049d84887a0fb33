"""Faults: each ends as a rejected trajectory with a logged reason; the session is cleaned up
and the next episode through the same workflow succeeds."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine
from tests.proxy import agents
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

pytestmark = pytest.mark.slow

OK = {"messages": [{"role": "user", "content": "fine question"}]}


@pytest.fixture(scope="module")
def proxy(tiny_tokenizer):
    def script(req):
        # An engine that fails on one kind of prompt: the proxy's error path, not a mock.
        if "ENGINE-FAIL" in tiny_tokenizer.decode(req.input_ids):
            raise RuntimeError("CUDA out of memory (simulated engine failure)")
        return "The answer is 7"

    with serve_proxy(ScriptedEngine(tiny_tokenizer, script), tiny_tokenizer) as p:
        yield p


def _wf(proxy, agent, **kw) -> OpenAIProxyWorkflow:
    return OpenAIProxyWorkflow(agent=agent, proxy_addr=proxy.url, admin_api_key=ADMIN_KEY, **kw)


def _reject_then_recover(proxy, wf, bad_data, kind, reason_part, caplog, good_data=OK):
    async def both():
        bad = await wf.arun_episode(None, bad_data)
        reason = wf.last_rejection_reason
        good = await wf.arun_episode(None, good_data)
        return bad, reason, good

    with caplog.at_level(logging.WARNING, logger="areal_nb.rollout.workflow"):
        bad, reason, good = asyncio.run(both())
    assert bad is None
    assert reason.startswith(f"{kind}: ") and reason_part in reason, reason
    assert f"rejected ({kind})" in caplog.text and reason_part in caplog.text
    assert wf.rejections == {kind: 1}
    assert good is not None and len(good) >= 1 and wf.accepted == 1
    assert live_sessions(proxy.app) == ({}, {})
    return good


def test_agent_raises_mid_episode(proxy, caplog):
    class Flaky:
        async def run(self, data, **kw):
            if data.get("fail"):
                return await agents.RaisingAgent().run(data, **kw)
            return await agents.ChatAgent().run(data, **kw)

    _reject_then_recover(
        proxy,
        _wf(proxy, Flaky()),
        {**OK, "fail": True},
        "agent_error",
        "RuntimeError: agent bug after the first call",
        caplog,
    )


def test_agent_hangs_past_timeout_inline(proxy, caplog):
    class MaybeHang:
        async def run(self, data, **kw):
            agent = agents.HangingAgent() if data.get("hang") else agents.ChatAgent()
            return await agent.run(data, **kw)

    wf = _wf(proxy, MaybeHang(), agent_timeout=1.0)
    _reject_then_recover(proxy, wf, {**OK, "hang": True}, "agent_timeout", "agent_timeout=1.0s", caplog)


def test_agent_hangs_past_timeout_subproc(proxy, caplog):
    # Generous timeout: the worker must spawn and make its call on two busy cores before hanging.
    wf = _wf(proxy, agents.HangingAgent(), mode="subproc", subproc_max_workers=1, agent_timeout=12.0)
    try:

        async def hang():
            return await wf.arun_episode(None, OK)

        with caplog.at_level(logging.WARNING, logger="areal_nb.rollout.workflow"):
            # First, a hang in synchronous code: the stuck worker is killed and the pool dropped.
            assert asyncio.run(hang()) is None
        assert wf.rejections == {"agent_timeout": 1} and wf._workers.pool is None
        assert "its worker pool was killed" in caplog.text
        assert live_sessions(proxy.app) == ({}, {})
        # The next episode gets a fresh pool and succeeds.
        wf.agent = agents.ChatAgent(turns=2)
        good = asyncio.run(wf.arun_episode(None, OK))
        assert len(good) == 2 and sorted(i.reward for i in good.values()) == [2.0, 3.0]
    finally:
        wf.close()


def test_engine_error_during_a_call(proxy, caplog):
    bad = {"messages": [{"role": "user", "content": "ENGINE-FAIL please"}]}
    _reject_then_recover(
        proxy, _wf(proxy, agents.ChatAgent()), bad, "agent_error", "InternalServerError", caplog
    )


@pytest.mark.parametrize(
    ("reward_fn", "reason_part"),
    [("crash", "RewardWorkerCrashedError"), ("hang", "RewardTimeoutError")],
)
def test_reward_function_crashes_pool_or_hangs(proxy, caplog, reward_fn, reason_part):
    class Agent:
        async def run(self, data, **kw):
            if "reward_fn" in data:
                return await agents.RewardFnAgent().run(data, **kw)
            return await agents.ChatAgent().run(data, **kw)

    _reject_then_recover(
        proxy, _wf(proxy, Agent()), {**OK, "reward_fn": reward_fn}, "agent_error", reason_part, caplog
    )


def test_episode_without_llm_call_is_rejected(proxy, caplog):
    class Agent:
        async def run(self, data, **kw):
            agent = agents.NoCallAgent() if data.get("skip") else agents.ChatAgent()
            return await agent.run(data, **kw)

    _reject_then_recover(
        proxy, _wf(proxy, Agent()), {**OK, "skip": True}, "no_interactions", "made no LLM call", caplog
    )


@pytest.mark.parametrize(
    ("ret", "reason_part"),
    [
        (True, "got bool"),
        (None, "got NoneType"),
        ("1.0", "got str"),
        ([1.0], "got list"),
        (math.nan, "non-finite"),
        ({}, "empty reward dict"),
        ({"chatcmpl-unknown": 1.0}, "chatcmpl-unknown"),
        ({"x": False}, "must be a finite int or float"),
    ],
    ids=["bool", "none", "str", "list", "nan", "empty-dict", "unknown-id", "bool-in-dict"],
)
def test_invalid_agent_returns_are_rejected(proxy, caplog, ret, reason_part):
    _reject_then_recover(
        proxy, _wf(proxy, agents.ChatAgent()), {**OK, "ret": ret}, "invalid_reward", reason_part, caplog
    )


def test_int_reward_is_accepted_for_the_last_call(proxy):
    wf = _wf(proxy, agents.ChatAgent(turns=2), discount=0.5)
    out = asyncio.run(wf.arun_episode(None, {**OK, "ret": "last_int"}))
    assert [i.reward for i in out.values()] == [0.5, 1.0]


def test_unreachable_proxy_is_a_bounded_rejection(caplog):
    wf = OpenAIProxyWorkflow(
        agent=agents.ChatAgent(), proxy_addr="http://127.0.0.1:9", admin_api_key=ADMIN_KEY
    )
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(wf.arun_episode(None, OK)) is None
    assert wf.rejections == {"proxy_error": 1}
    assert "grant_capacity failed (no response)" in wf.last_rejection_reason

"""End to end: real uvicorn proxy on loopback, real SDKs, OpenAIProxyWorkflow episodes.

The real tiny model (`LocalEngine("tiny-math")`) serves every SDK path; ScriptedEngine only
where one exact reply is needed (the Agents SDK tool call).
"""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI

from areal_nb.proxy.client import OpenAIProxyClient, ProxyRequestError
from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine
from tests.proxy import agents
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

pytestmark = pytest.mark.slow

QUESTION = {
    "messages": [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples?"}],
    "answer": "#### 7",
}


@pytest.fixture(scope="module")
def proxy(local_engine, tiny_tokenizer):
    with serve_proxy(local_engine, tiny_tokenizer) as p:
        yield p


def _workflow(proxy, agent, **kw) -> OpenAIProxyWorkflow:
    return OpenAIProxyWorkflow(agent=agent, proxy_addr=proxy.url, admin_api_key=ADMIN_KEY, **kw)


def _check_tokens(interaction) -> None:
    """The exported row is exactly the engine's tokens: prompt, then the generated tokens."""
    resp = interaction.model_response
    assert resp.output_len > 0
    assert len(resp.output_logprobs) == len(resp.output_versions) == resp.output_len
    row = interaction.to_tensor_dict()
    ids = row["input_ids"][0].tolist()
    assert ids[-resp.output_len :] == resp.output_tokens
    assert row["loss_mask"][0].tolist()[-resp.output_len :] == [1] * resp.output_len
    assert row["logprobs"][0].tolist()[-resp.output_len :] == pytest.approx(resp.output_logprobs)
    assert all(lp <= 0.0 for lp in resp.output_logprobs)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_async_openai_two_turns_inline(proxy, stream):
    agent = agents.ChatAgent(turns=2, max_tokens=6, stream=stream)
    wf = _workflow(proxy, agent, discount=0.5)
    data = {"messages": [{"role": "user", "content": "What is 2+3?"}]}
    out = asyncio.run(wf.arun_episode(None, data))
    (first, text1), (second, text2) = agent.seen
    assert list(out) == [first, second]
    assert out[second].parent is out[first]
    # dict reward {first: 1, second: 2}, discounted over the tree with γ = 0.5
    assert out[second].reward == 2.0 and out[first].reward == 1.0 + 0.5 * 2.0
    assert out[first].output_message_list[0]["content"] == text1
    assert out[second].output_message_list[0]["content"] == text2
    for interaction in out.values():
        _check_tokens(interaction)
    assert data == {"messages": [{"role": "user", "content": "What is 2+3?"}]}  # deep-copied
    assert wf.accepted == 1 and not wf.rejections
    assert live_sessions(proxy.app) == ({}, {})


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_async_anthropic_inline(proxy, stream):
    wf = _workflow(proxy, agents.AnthropicAgent(stream=stream))
    out = asyncio.run(wf.arun_episode(None, QUESTION))
    assert len(out) == 1
    (interaction,) = out.values()
    assert interaction.reward == 2.0
    _check_tokens(interaction)
    assert live_sessions(proxy.app) == ({}, {})


@pytest.fixture(scope="module")
def subproc_workflows(proxy):
    made: list[OpenAIProxyWorkflow] = []

    def make(agent):
        wf = _workflow(proxy, agent, mode="subproc", subproc_max_workers=1, agent_timeout=120)
        made.append(wf)
        return wf

    yield make
    for wf in made:
        wf.close()


def test_sync_openai_in_subproc(proxy, subproc_workflows):
    wf = subproc_workflows(agents.SyncOpenAIAgent())
    out = asyncio.run(wf.arun_episode(None, QUESTION))
    assert len(out) == 1
    (interaction,) = out.values()
    assert interaction.reward == 0.5
    _check_tokens(interaction)
    # The worker is reused, and its environment holds no key of the finished session.
    out2 = asyncio.run(wf.arun_episode(None, QUESTION))
    assert len(out2) == 1 and set(out2).isdisjoint(out)
    assert live_sessions(proxy.app) == ({}, {})


def test_anthropic_from_env_in_subproc(proxy, subproc_workflows):
    wf = subproc_workflows(agents.AnthropicAgent())
    out = asyncio.run(wf.arun_episode(None, QUESTION))
    assert [i.reward for i in out.values()] == [2.0]


def test_multi_turn_math_agent(proxy):
    from areal_nb.agents import MultiTurnMathAgent

    agent = MultiTurnMathAgent(max_turns=2, max_completion_tokens=24)
    wf = _workflow(proxy, agent, discount=0.9)
    out = asyncio.run(wf.arun_episode(None, QUESTION))
    assert 1 <= len(out) <= 2
    rewards = [i.reward for i in out.values()]
    assert all(r in (0.0, 1.0, 0.9) for r in rewards)
    if len(out) == 2:  # the first answer was wrong: the correction turn is its child
        first, second = out.values()
        assert second.parent is first
        assert second.messages[-1]["content"].startswith("Your answer is either wrong")
        assert first.reward == pytest.approx(0.9 * second.reward)
    agent._reward_fn().close()


def _tool_script(tokenizer):
    def reply(req):
        prompt = tokenizer.decode(req.input_ids)
        if "SUM=3" in prompt:
            return "The sum is 3."
        return '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'

    return reply


def test_openai_agents_sdk_function_tool(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, _tool_script(tiny_tokenizer))
    with serve_proxy(engine, tiny_tokenizer) as proxy:
        wf = _workflow(proxy, agents.ToolAgent())
        out = asyncio.run(wf.arun_episode(None, {"messages": [{"role": "user", "content": "add 1 and 2"}]}))
        assert wf.last_rejection_reason is None, wf.last_rejection_reason
        first, second = out.values()
        call = first.output_message_list[0]["tool_calls"][0]
        assert call["function"]["name"] == "add"
        assert call["function"]["arguments"].replace(" ", "") == '{"a":1,"b":2}'
        assert second.output_message_list[0]["content"] == "The sum is 3."
        assert second.reward == 1.0
        # The SDK echoes the tool-call message without its empty content: still the same
        # conversation, so the tool call is the answer's parent and gets its return (γ = 1).
        assert second.parent_id == first.interaction_id and first.reward == 1.0
        assert len(engine.requests) == 2
        assert live_sessions(proxy.app) == ({}, {})


def test_openai_agents_sdk_function_tool_on_the_real_model(proxy, tiny_tokenizer):
    """Twin of the scripted test: the Agents SDK against tiny-math through the proxy. The tiny
    model rarely emits a tool call, so the episode ends after one or more real generations; what
    is checked is that the SDK accepts every real response and the calls are recorded exactly,
    with the tool's schema rendered into the prompt."""
    wf = _workflow(proxy, agents.ToolAgent())
    out = asyncio.run(wf.arun_episode(None, {"messages": [{"role": "user", "content": "add 1 and 2"}]}))
    assert wf.last_rejection_reason is None, wf.last_rejection_reason
    assert len(out) >= 1
    first = next(iter(out.values()))
    prompt = tiny_tokenizer.decode(first.model_response.input_tokens)
    assert "<tools>" in prompt and '"add"' in prompt
    for interaction in out.values():
        _check_tokens(interaction)
    assert live_sessions(proxy.app) == ({}, {})


def test_sessions_are_isolated(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, "The answer is 7")

    async def scenario(url):
        a = OpenAIProxyClient(url, ADMIN_KEY, "a")
        b = OpenAIProxyClient(url, ADMIN_KEY, "b")
        await a.grant_capacity()
        await b.grant_capacity()
        async with a, b:
            oa = AsyncOpenAI(base_url=f"{url}/v1", api_key=a.session_api_key, max_retries=0)
            ob = AsyncOpenAI(base_url=f"{url}/v1", api_key=b.session_api_key, max_retries=0)
            user = {"role": "user", "content": "q"}
            ca = await oa.chat.completions.create(model="m", messages=[user])
            # B replays A's conversation: it must not become a child of A's call.
            follow = [
                user,
                ca.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "and?"},
            ]
            cb = await ob.chat.completions.create(model="m", messages=follow)
            with pytest.raises(ProxyRequestError) as cross_reward:
                await a.set_reward(cb.id, 5.0)  # A cannot reward B's call
            await b.set_last_reward(1.0)
            # A session key is not an admin key: it can export nothing, not even its own session.
            sneaky = OpenAIProxyClient(url, a.session_api_key, "x")
            sneaky._session_id = b.session_id
            with pytest.raises(ProxyRequestError) as cross_export:
                await sneaky.export_interactions()
            await sneaky.aclose()
        out_a = await a.export_interactions()
        out_b = await b.export_interactions()
        for c in (a, b):
            await c.aclose()
        return ca.id, cb.id, out_a, out_b, cross_reward.value, cross_export.value

    with serve_proxy(engine, tiny_tokenizer) as proxy:
        ida, idb, out_a, out_b, cross_reward, cross_export = asyncio.run(scenario(proxy.url))
        assert list(out_a) == [ida] and list(out_b) == [idb]
        assert out_b[idb].parent is None and out_b[idb].parent_id is None
        assert out_a[ida].to_tensor_dict()["rewards"].tolist() == [0.0] and out_b[idb].reward == 1.0
        assert cross_reward.status == 400
        assert cross_export.status == 403
        assert live_sessions(proxy.app) == ({}, {})

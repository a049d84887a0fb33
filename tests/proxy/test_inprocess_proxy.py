"""In-process episodes: an inline agent's `http_client` calls the proxy app over an
ASGI transport and the lifecycle is direct calls on its ProxyState — no socket anywhere.

The unit tests point `proxy_addr` at an address that cannot resolve, so an episode that
succeeds proves nothing went over the network. The server tests check the in-process path next
to uvicorn serving the same app (external agents, agents that ignore `http_client`, the real
engine answering both loops) and that it exports exactly what the HTTP path exports.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from areal_nb.proxy import ProxyRequestError
from areal_nb.proxy.inprocess import InProcessProxyClient
from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine
from tests.proxy import agents
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

UNREACHABLE = "http://proxy.invalid:9"  # .invalid never resolves (RFC 2606)
QUESTION = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}


@pytest.fixture
def app(make_app):
    return make_app(admin_api_key=ADMIN_KEY)


def in_process_workflow(
    app: Any, agent: Any, proxy_addr: str = UNREACHABLE, **kwargs: Any
) -> OpenAIProxyWorkflow:
    return OpenAIProxyWorkflow(
        agent=agent, proxy_addr=proxy_addr, admin_api_key=ADMIN_KEY, asgi_app=app, **kwargs
    )


async def run_episodes(wf: OpenAIProxyWorkflow, *data: dict[str, Any]) -> list[Any]:
    try:
        return await asyncio.gather(*(wf.arun_episode(None, d) for d in data))
    finally:
        await wf.aclose()


class OwnClientAgent:
    """Ignores the given `http_client` and builds its own (so it reaches `base_url` over HTTP)."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], max_retries=0)
        try:
            completion = await client.chat.completions.create(
                model="default", messages=data["messages"], max_tokens=8
            )
        finally:
            await client.close()
        return 1.0 if completion.choices[0].message.content else 0.0


def test_inline_episode_runs_without_sockets(app):
    wf = in_process_workflow(app, agents.ChatAgent(turns=2))
    [episode] = asyncio.run(run_episodes(wf, QUESTION))

    assert episode is not None, wf.last_rejection_reason
    # ChatAgent rewards turn i with i + 1; undiscounted tree rewards: the first call gets its
    # own reward plus its child's.
    ids = [cid for cid, _ in wf.agent.seen]
    assert {iid: it.reward for iid, it in episode.items()} == {ids[0]: 3.0, ids[1]: 2.0}
    assert [text.startswith("The answer is") for _, text in wf.agent.seen] == [True, True]  # max 8 tokens
    assert live_sessions(app) == ({}, {})  # exported and forgotten
    assert app.state.proxy.capacity == 0


def test_inline_episodes_run_concurrently_and_reject_like_http(app):
    wf = in_process_workflow(app, agents.ChatAgent())
    results = asyncio.run(run_episodes(wf, QUESTION, {**QUESTION, "ret": "bad"}, {**QUESTION, "ret": 0.5}))

    assert results[0] is not None and results[1] is None
    assert [it.reward for it in results[2].values()] == [0.5]
    assert wf.accepted == 2 and wf.rejections == {"invalid_reward": 1}
    assert live_sessions(app) == ({}, {})


@pytest.mark.parametrize(
    ("agent", "kind"), [(agents.NoCallAgent(), "no_interactions"), (agents.RaisingAgent(), "agent_error")]
)
def test_rejected_in_process_episode_frees_its_session(app, agent, kind):
    wf = in_process_workflow(app, agent)
    assert asyncio.run(run_episodes(wf, QUESTION)) == [None]
    assert wf.rejections == {kind: 1}
    assert live_sessions(app) == ({}, {})


def test_cancelled_and_timed_out_in_process_episodes_free_their_sessions(app):
    state = app.state.proxy

    async def main() -> None:
        wf = in_process_workflow(app, agents.HangingAgent())
        task = asyncio.create_task(wf.arun_episode(None, QUESTION))
        while not any(len(s.cache) for s in list(state.sessions.values())):  # the call is recorded
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        timed = in_process_workflow(app, agents.HangingAgent(), agent_timeout=0.5)
        assert await run_episodes(timed, QUESTION) == [None]
        assert timed.rejections == {"agent_timeout": 1}
        await wf.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert live_sessions(app) == ({}, {})


def test_unknown_interaction_reward_is_rejected_not_lost(app):
    wf = in_process_workflow(app, agents.ChatAgent())
    assert asyncio.run(run_episodes(wf, {**QUESTION, "ret": {"no-such-call": 1.0}})) == [None]
    assert wf.rejections == {"invalid_reward": 1}
    assert "not found in session" in wf.last_rejection_reason


def test_client_errors_carry_the_http_status(app):
    state = app.state.proxy

    async def main() -> None:
        client = InProcessProxyClient(state, "t")
        with pytest.raises(ProxyRequestError) as err:
            await client.start_session()  # no capacity granted
        assert err.value.status == 429 and err.value.endpoint == "rl/start_session"

        assert await client.grant_capacity() == 1
        async with client:
            with pytest.raises(ProxyRequestError) as err:
                await client.set_last_reward(1.0)
            assert err.value.status == 400 and "no interactions" in err.value.detail
            from areal_nb.capture import InteractionWithTokenLogpReward

            pending = InteractionWithTokenLogpReward(
                messages=[{"role": "user", "content": "q"}], _interaction_id="p"
            )
            state.sessions[client.session_id].cache["p"] = pending  # a call still generating
            with pytest.raises(ProxyRequestError) as err:
                await client.set_last_reward(1.0)
            assert err.value.status == 400 and "1 call is still generating" in err.value.detail
            del state.sessions[client.session_id].cache["p"]
            with pytest.raises(ProxyRequestError) as err:
                await client.export_interactions()
            assert err.value.status == 504  # not ended yet: nothing lost
        assert await client.export_interactions() == {}
        with pytest.raises(ProxyRequestError) as err:
            await client.export_interactions()
        assert err.value.status == 404  # one-shot
        with pytest.raises(ProxyRequestError) as err:
            await client.set_last_reward(1.0)
        assert err.value.status == 410

    asyncio.run(main())
    assert live_sessions(app) == ({}, {})


def test_constructor_checks():
    with pytest.raises(TypeError, match="not a proxy app"):
        OpenAIProxyWorkflow(
            agent=agents.ChatAgent(), proxy_addr=UNREACHABLE, admin_api_key="k", asgi_app=object()
        )
    with pytest.raises(TypeError, match="needs a ProxyState"):
        InProcessProxyClient(object(), "t")  # type: ignore[arg-type]


def test_subproc_mode_ignores_the_app(app):
    wf = OpenAIProxyWorkflow(
        agent=agents.SyncRunAgent(),
        mode="subproc",
        proxy_addr=UNREACHABLE,
        admin_api_key=ADMIN_KEY,
        asgi_app=app,
    )
    assert wf.asgi_app is None and wf.proxy_state is None  # external agents keep the HTTP path


# ----------------------------------------------------------------------------- next to uvicorn
@pytest.mark.server
def test_agent_that_builds_its_own_client_goes_over_http(tiny_tokenizer):
    with serve_proxy(ScriptedEngine(tiny_tokenizer, "The answer is 4"), tiny_tokenizer) as p:
        wf = in_process_workflow(p.app, OwnClientAgent(), proxy_addr=p.url)
        [episode] = asyncio.run(run_episodes(wf, QUESTION))
        assert episode is not None, wf.last_rejection_reason
        assert [it.reward for it in episode.values()] == [1.0]
        assert live_sessions(p.app) == ({}, {})


def _tensors(episode: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    return [it.to_tensor_dict() for it in episode.values()]


@pytest.mark.server
def test_in_process_export_equals_http_export(tiny_tokenizer):
    """Same scripted engine, same agent: the two paths give the same training tensors."""
    with serve_proxy(ScriptedEngine(tiny_tokenizer, "The answer is 4"), tiny_tokenizer) as p:
        data = {**QUESTION, "ret": 1.0}
        http = asyncio.run(
            run_episodes(
                OpenAIProxyWorkflow(
                    agent=agents.ChatAgent(turns=3), proxy_addr=p.url, admin_api_key=ADMIN_KEY, discount=0.5
                ),
                data,
            )
        )[0]
        local = asyncio.run(
            run_episodes(
                in_process_workflow(p.app, agents.ChatAgent(turns=3), proxy_addr=p.url, discount=0.5), data
            )
        )[0]
    assert len(http) == len(local) == 3
    for a, b in zip(_tensors(http), _tensors(local), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert [it.reward for it in local.values()] == [0.25, 0.5, 1.0]


@pytest.mark.server
def test_raw_calls_over_http_equal_the_in_process_ones(tiny_tokenizer):
    """`raw_calls=True` (the Session's workflows): both clients give every call with the reward
    the agent set (ChatAgent: turn i gets i + 1), whatever the workflow's discount."""
    with serve_proxy(ScriptedEngine(tiny_tokenizer, "The answer is 4"), tiny_tokenizer) as p:
        kwargs = {"discount": 0.5, "raw_calls": True}
        http = asyncio.run(
            run_episodes(
                OpenAIProxyWorkflow(
                    agent=agents.ChatAgent(turns=3), proxy_addr=p.url, admin_api_key=ADMIN_KEY, **kwargs
                ),
                QUESTION,
            )
        )[0]
        local = asyncio.run(
            run_episodes(
                in_process_workflow(p.app, agents.ChatAgent(turns=3), proxy_addr=p.url, **kwargs), QUESTION
            )
        )[0]
    assert [it.reward for it in http.values()] == [it.reward for it in local.values()] == [1.0, 2.0, 3.0]
    for a, b in zip(_tensors(http), _tensors(local), strict=True):
        for key in a:
            assert torch.equal(a[key], b[key]), key


@pytest.mark.server
def test_real_engine_serves_both_loops_at_once(local_engine, tiny_tokenizer):
    """In-process episodes on this loop while an external agent calls uvicorn on another thread:
    the engine's futures, the state's lock and the session-end events work from both loops."""
    with serve_proxy(local_engine, tiny_tokenizer) as p:
        external: list[Any] = []

        def external_agent() -> None:
            wf = OpenAIProxyWorkflow(
                agent=agents.ChatAgent(turns=2), proxy_addr=p.url, admin_api_key=ADMIN_KEY
            )
            external.extend(asyncio.run(run_episodes(wf, *[{**QUESTION, "ret": 1.0}] * 4)))

        thread = threading.Thread(target=external_agent)
        thread.start()
        wf = in_process_workflow(p.app, agents.ChatAgent(turns=2), proxy_addr=p.url)
        local = asyncio.run(run_episodes(wf, *[{**QUESTION, "ret": 1.0}] * 4))
        thread.join(120)
        assert not thread.is_alive()
        for episode in [*local, *external]:
            assert episode is not None and len(episode) == 2
            for interaction in episode.values():
                logprobs = interaction.model_response.output_logprobs
                assert len(logprobs) == interaction.model_response.output_len > 0
        # An HTTP export drops its session once the response is sent, on the server's thread,
        # which may run just after the client has the data.
        deadline = time.monotonic() + 10
        while live_sessions(p.app) != ({}, {}) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live_sessions(p.app) == ({}, {})


# ----------------------------------------------------------------------------- Session wiring
@pytest.mark.parametrize(("mode", "in_process"), [("inline", True), ("subproc", False)])
def test_session_builder_serves_inline_agents_in_process(make_app, mode, in_process):
    """Training sessions live in the root app's state; evaluation ones in the /eval twin's,
    reached in-process through the root app (which routes /eval/...)."""
    from types import SimpleNamespace

    from areal_nb.config import load_config
    from areal_nb.session import builder

    cfg = load_config(builder_config_path(), [f"agent.mode={mode}"])
    app, eval_app = make_app(), make_app()
    proxy = builder.Proxy(app=app, server=SimpleNamespace(url=UNREACHABLE), admin_key="k", eval_app=eval_app)
    workflow = builder.build_workflow(cfg, proxy)
    evaluation = builder.build_eval_workflow(cfg, proxy, workflow)
    if in_process:
        assert workflow.asgi_app is app and workflow.proxy_state is app.state.proxy
        assert evaluation.asgi_app is app and evaluation.proxy_state is eval_app.state.proxy
        assert evaluation.proxy_addr == UNREACHABLE + "/eval"
    else:
        assert workflow.proxy_state is None and evaluation.proxy_state is None


def builder_config_path():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"


def test_in_process_client_keeps_cookies_and_skips_the_jar_for_responses_without_them():
    """The client inline agents get behaves like a plain httpx client on cookies (a Set-Cookie is
    stored and sent back, cookies can be replaced); only responses without Set-Cookie skip the jar."""
    import httpx

    from areal_nb.proxy.inprocess import InProcessClient, SetCookieOnlyCookies

    async def app(scope, receive, send):
        await receive()
        headers = [(b"content-type", b"text/plain")]
        if scope["path"] == "/set":
            headers.append((b"set-cookie", b"k=v; Path=/"))
        cookie = dict(scope["headers"]).get(b"cookie", b"")
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": cookie})

    jar_calls = []

    async def run() -> list[str]:
        async with InProcessClient(
            transport=httpx.ASGITransport(app=app), base_url="http://x", cookies={"a": "1"}
        ) as c:
            jar = c.cookies.jar
            original = jar.extract_cookies
            jar.extract_cookies = lambda *a: jar_calls.append(1) or original(*a)
            sent = [(await c.get("/plain")).text, (await c.get("/set")).text, (await c.get("/plain")).text]
            c.cookies = {"z": "9"}
            assert isinstance(c.cookies, SetCookieOnlyCookies)
            return [*sent, (await c.get("/plain")).text]

    assert asyncio.run(run()) == ["a=1", "a=1", "a=1; k=v", "z=9"]
    assert jar_calls == [1]  # only the response that set a cookie reached the jar

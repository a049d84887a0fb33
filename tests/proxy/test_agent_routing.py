"""With one adapter per agent (`AgentEngines`), the proxy sends each call to the engine of the
agent its `model` names, through every door, and answers 400 naming the agents for a call from
any other agent (or none)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from areal_nb.engine.agent_engines import AgentEngines
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import session_headers, start_session

AGENTS = ["solver", "checker"]


def test_the_proxy_routes_each_call_to_its_agents_engine_and_refuses_others(make_app, tiny_tokenizer):
    engines = AgentEngines({a: ScriptedEngine(tiny_tokenizer, f"the {a} speaks") for a in AGENTS})
    with TestClient(make_app(engines)) as client:
        _, key = start_session(client)
        for agent in AGENTS:
            reply = client.post(
                "/v1/chat/completions",
                headers=session_headers(key),
                json={"model": agent, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == f"the {agent} speaks"
            assert len(engines.engines[agent].requests) == 1
            assert engines.engines[agent].requests[0].agent == agent
        for model in ("stranger", None):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
            if model is not None:
                body["model"] = model
            refused = client.post("/v1/chat/completions", headers=session_headers(key), json=body)
            assert refused.status_code == 400, refused.text
            assert "'solver', 'checker'" in refused.json()["error"]["message"]
        messages = client.post(  # the Anthropic door routes by `model` too
            "/v1/messages",
            headers={"x-api-key": key},
            json={"model": "checker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32},
        )
        assert messages.status_code == 200, messages.text
        assert len(engines.engines["checker"].requests) == 2

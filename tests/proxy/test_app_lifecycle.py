"""Session lifecycle codes: capacity, key reuse, end → export, one-shot export,
export wait timeout, stale-session sweep, rewards, and the wire format round trip."""

from __future__ import annotations

import time

import pytest
import torch

from areal_nb.capture.interaction import InteractionWithTokenLogpReward
from tests.proxy.conftest import admin_headers, session_headers, start_session

CHAT = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}


def _chat(client, key, messages):
    r = client.post(
        "/v1/chat/completions", headers=session_headers(key), json={"messages": messages, "max_tokens": 8}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_no_capacity_is_429_and_each_session_uses_one_slot(app_client):
    r = app_client.post("/rl/start_session", headers=admin_headers(), json={"task_id": "t"})
    assert r.status_code == 429 and "capacity" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "1"  # a slot frees when a session ends: a retry can succeed
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert app_client.post("/grant_capacity", headers=admin_headers(), json={"count": 2}).json() == {
        "capacity": 2
    }
    ids = [
        app_client.post("/rl/start_session", headers=admin_headers(), json={"task_id": "t"}).json()[
            "session_id"
        ]
        for _ in range(2)
    ]
    assert ids == ["t-0", "t-1"]
    assert (
        app_client.post("/rl/start_session", headers=admin_headers(), json={"task_id": "t"}).status_code
        == 429
    )


def test_requested_keys(app_client):
    app_client.post("/grant_capacity", headers=admin_headers(), json={"count": 5})

    def start(**body):
        return app_client.post("/rl/start_session", headers=admin_headers(), json={"task_id": "k", **body})

    r = start(api_key="my-own-session-key")
    assert r.status_code == 200 and r.json()["api_key"] == "my-own-session-key"
    first = r.json()["session_id"]
    assert start(api_key="my-own-session-key").status_code == 409  # bound to an active session
    assert start(api_key="proxy-test-admin-key").status_code == 400  # the admin key
    generated = start().json()["api_key"]
    assert len(generated) > 20 and generated != "proxy-test-admin-key"
    # after end_session the key may be reused; the old session stays exportable by id
    _chat(app_client, "my-own-session-key", CHAT["messages"])
    app_client.post("/rl/end_session", headers=session_headers("my-own-session-key"))
    r = start(api_key="my-own-session-key")
    assert r.status_code == 200 and r.json()["session_id"] != first
    old = app_client.post("/export_trajectories", headers=admin_headers(), json={"session_id": first})
    assert old.status_code == 200 and len(old.json()["interactions"]) == 1


def test_chat_after_end_is_409_rewards_still_allowed(app_client):
    _, key = start_session(app_client)
    call = _chat(app_client, key, CHAT["messages"])["id"]
    assert app_client.post("/rl/end_session", headers=session_headers(key)).json()["interaction_count"] == 1
    r = app_client.post("/v1/chat/completions", headers=session_headers(key), json=CHAT)
    assert r.status_code == 409 and "has ended" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"
    r = app_client.post(
        "/rl/set_reward", headers=session_headers(key), json={"interaction_id": call, "reward": 2}
    )
    assert r.status_code == 200
    assert app_client.post("/rl/end_session", headers=session_headers(key)).status_code == 200  # idempotent


def test_export_is_one_shot_and_gone_keys_answer_410(app_client):
    sid, key = start_session(app_client)
    _chat(app_client, key, CHAT["messages"])
    app_client.post("/rl/end_session", headers=session_headers(key))
    assert (
        app_client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid}).status_code
        == 200
    )
    again = app_client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert again.status_code == 404 and "unknown session_id" in again.json()["error"]["message"]
    for path, body in [
        ("/rl/end_session", None),
        ("/rl/set_reward", {"reward": 1}),
        ("/v1/chat/completions", CHAT),
    ]:
        r = app_client.post(path, headers=session_headers(key), json=body)
        assert r.status_code == 410 and "was exported" in r.json()["error"]["message"], path
    assert (
        app_client.post(
            "/export_trajectories", headers=admin_headers(), json={"session_id": "nope-0"}
        ).status_code
        == 404
    )


def test_export_waits_for_end_session_with_a_timeout(make_app):
    from fastapi.testclient import TestClient

    with TestClient(make_app(export_wait_timeout=0.2)) as client:
        sid, key = start_session(client)
        r = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
        assert r.status_code == 504 and "did not end within 0.2 s" in r.json()["error"]["message"]
        # still exportable once ended
        client.post("/rl/end_session", headers=session_headers(key))
        r = client.post(
            "/export_trajectories", headers=admin_headers(), json={"session_id": sid, "wait_timeout": 0.1}
        )
        assert r.status_code == 200


def test_stale_sessions_are_swept(make_app):
    from fastapi.testclient import TestClient

    with TestClient(make_app(session_timeout=0.05, sweep_interval=0)) as client:
        sid, key = start_session(client, "old")
        time.sleep(0.1)
        start_session(client, "new")  # start_session sweeps
        state = client.app.state.proxy
        assert sid not in state.sessions and key not in state._key_to_session
        r = client.post("/v1/chat/completions", headers=session_headers(key), json=CHAT)
        assert r.status_code == 410 and "expired" in r.json()["error"]["message"]


def test_set_reward_last_and_by_id_and_unknown(app_client):
    sid, key = start_session(app_client)
    first = _chat(app_client, key, CHAT["messages"])
    second = _chat(
        app_client,
        key,
        [*CHAT["messages"], first["choices"][0]["message"], {"role": "user", "content": "sure?"}],
    )
    h = session_headers(key)
    assert app_client.post("/rl/set_reward", headers=h, json={"reward": 1}).status_code == 200
    assert (
        app_client.post(
            "/rl/set_reward", headers=h, json={"interaction_id": first["id"], "reward": 0.5}
        ).status_code
        == 200
    )
    r = app_client.post("/rl/set_reward", headers=h, json={"interaction_id": "chatcmpl-nope", "reward": 1})
    assert r.status_code == 400 and "chatcmpl-nope" in r.json()["error"]["message"]
    cache = app_client.app.state.proxy.sessions[sid].cache
    assert cache[second["id"]].reward == 1.0 and cache[first["id"]].reward == 0.5
    assert cache[second["id"]].parent is cache[first["id"]]


@pytest.mark.parametrize("mode,expected_first", [("tree", 0.5 + 0.9 * 1.0), ("linear", 0.5 + 0.9 * 1.0)])
def test_export_wire_round_trip_equals_server_tensors(app_client, mode, expected_first):
    sid, key = start_session(app_client)
    first = _chat(app_client, key, CHAT["messages"])
    second = _chat(
        app_client,
        key,
        [*CHAT["messages"], first["choices"][0]["message"], {"role": "user", "content": "sure?"}],
    )
    h = session_headers(key)
    app_client.post("/rl/set_reward", headers=h, json={"interaction_id": first["id"], "reward": 0.5})
    app_client.post("/rl/set_reward", headers=h, json={"reward": 1.0})
    app_client.post("/rl/end_session", headers=h)
    cache = app_client.app.state.proxy.sessions[sid].cache
    r = app_client.post(
        "/export_trajectories",
        headers=admin_headers(),
        json={"session_id": sid, "discount": 0.9, "discount_mode": mode},
    )
    assert r.status_code == 200
    wire = r.json()["interactions"]
    assert list(wire) == [first["id"], second["id"]]
    rebuilt: dict[str, InteractionWithTokenLogpReward] = {}
    for iid, item in wire.items():
        rebuilt[iid] = InteractionWithTokenLogpReward.from_wire(item, rebuilt)
    assert rebuilt[second["id"]].parent is rebuilt[first["id"]]
    assert rebuilt[first["id"]].reward == pytest.approx(expected_first)
    for iid in wire:
        server, client = cache[iid].to_tensor_dict(), rebuilt[iid].to_tensor_dict()
        assert server.keys() == client.keys()
        for name in server:
            assert server[name].dtype == client[name].dtype and torch.equal(server[name], client[name]), name
        assert client["logprobs"][0, -1].item() == pytest.approx(-0.5)  # ScriptedEngine's log-prob


def test_concat_style_on_hf_interactions_is_400_and_loses_nothing(app_client):
    sid, key = start_session(app_client)
    _chat(app_client, key, CHAT["messages"])
    app_client.post("/rl/end_session", headers=session_headers(key))
    r = app_client.post(
        "/export_trajectories", headers=admin_headers(), json={"session_id": sid, "style": "concat"}
    )
    assert r.status_code == 400 and "concat" in r.json()["error"]["message"]
    r = app_client.post(
        "/export_trajectories", headers=admin_headers(), json={"session_id": sid, "style": "individual"}
    )
    assert r.status_code == 200 and len(r.json()["interactions"]) == 1


def test_engine_failure_is_500_and_nothing_half_recorded(make_app, tiny_tokenizer):
    from fastapi.testclient import TestClient

    from areal_nb.testing import ScriptedEngine

    def script(req):
        if "boom" in tiny_tokenizer.decode(req.input_ids):
            raise RuntimeError("engine exploded")
        return "ok"

    with TestClient(make_app(ScriptedEngine(tiny_tokenizer, script))) as client:
        sid, key = start_session(client)
        r = client.post(
            "/v1/chat/completions",
            headers=session_headers(key),
            json={"messages": [{"role": "user", "content": "boom"}]},
        )
        assert r.status_code == 500 and "engine exploded" in r.json()["error"]["message"]
        assert len(client.app.state.proxy.sessions[sid].cache) == 0
        assert _chat(client, key, CHAT["messages"])["choices"][0]["message"]["content"] == "ok"

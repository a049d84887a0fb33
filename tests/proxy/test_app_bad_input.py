"""Bad input on every endpoint → 4xx with a clear message; the server and other sessions are fine."""

from __future__ import annotations

import pytest

from tests.proxy.conftest import admin_headers, session_headers, start_session

OK_CHAT = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}

BAD_SESSION_BODIES = [
    ("/v1/chat/completions", {"messages": []}, 422, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 422, "messages"),
    ("/v1/chat/completions", {"messages": [1, 2]}, 422, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/v1/chat/completions", {**OK_CHAT, "max_tokens": 10**12}, 422, "max_tokens"),
    ("/v1/chat/completions", {**OK_CHAT, "max_tokens": -1}, 422, "max_tokens"),
    ("/v1/chat/completions", {**OK_CHAT, "max_tokens": "many"}, 422, "max_tokens"),
    ("/v1/chat/completions", {**OK_CHAT, "temperature": "hot"}, 422, "temperature"),
    ("/v1/chat/completions", {**OK_CHAT, "n": 0}, 422, "n"),
    ("/v1/chat/completions", {**OK_CHAT, "n": 17}, 400, "n=17 is more than 16 choices"),
    (
        "/v1/chat/completions",
        {"messages": OK_CHAT["messages"], "max_tokens": 4, "max_completion_tokens": 4},
        400,
        "max_tokens",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "max_total_tokens": 3}, 400, "exceeds"),
    ("/v1/responses", {"input": 7}, 422, "input"),
    ("/v1/responses", {"input": "hi", "stream": "yes please"}, 422, "stream"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 422, "max_tokens"),
    (
        "/v1/messages",
        {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]},
        400,
        "role",
    ),
    (
        "/v1/messages",
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        400,
        "video",
    ),
    ("/rl/set_reward", {"reward": "lots"}, 422, "reward"),
    ("/rl/set_reward", {}, 422, "reward"),
    ("/rl/set_reward", {"interaction_id": "chatcmpl-unknown", "reward": 1}, 400, "chatcmpl-unknown"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD_SESSION_BODIES)
def test_bad_session_requests(app_client, path, body, status, needle):
    sid_other, key_other = start_session(app_client, "other")
    good = app_client.post("/v1/chat/completions", headers=session_headers(key_other), json=OK_CHAT).json()[
        "id"
    ]
    _, key = start_session(app_client, "bad")
    r = app_client.post(path, headers=session_headers(key), json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    # server alive, the other session untouched, the bad one recorded nothing
    state = app_client.app.state.proxy
    assert list(state.sessions[sid_other].cache) == [good]
    assert len(state.sessions["bad-0"].cache) == 0
    assert (
        app_client.post("/v1/chat/completions", headers=session_headers(key), json=OK_CHAT).status_code == 200
    )


BAD_ADMIN_BODIES = [
    ("/rl/start_session", {}, 422, "task_id"),
    ("/rl/start_session", {"task_id": ""}, 422, "task_id"),
    ("/rl/start_session", {"task_id": "t", "api_key": 5}, 422, "api_key"),
    ("/grant_capacity", {"count": 0}, 422, "count"),
    ("/export_trajectories", {}, 422, "session_id"),
    ("/export_trajectories", {"session_id": "x-0", "style": "weird"}, 422, "style"),
    ("/export_trajectories", {"session_id": "x-0", "discount": 7}, 422, "discount"),
    ("/export_trajectories", {"session_id": "x-0", "discount_mode": "sideways"}, 422, "discount_mode"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD_ADMIN_BODIES)
def test_bad_admin_requests(app_client, path, body, status, needle):
    r = app_client.post(path, headers=admin_headers(), json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/rl/start_session"])
def test_malformed_json_and_wrong_content_type(app_client, path):
    _, key = start_session(app_client)
    headers = admin_headers() if path.startswith("/rl/start") else session_headers(key)
    r = app_client.post(
        path, headers={**headers, "content-type": "application/json"}, content=b'{"messages": ['
    )
    assert r.status_code == 422 and "JSON decode error" in r.json()["error"]["message"]
    r = app_client.post(path, headers={**headers, "content-type": "text/plain"}, content=b"hello")
    assert r.status_code == 422


def test_huge_body_is_413(make_app):
    from fastapi.testclient import TestClient

    with TestClient(make_app(max_body_bytes=64 * 1024)) as client:
        _, key = start_session(client)
        big = {"messages": [{"role": "user", "content": "x" * 100_000}]}
        r = client.post("/v1/chat/completions", headers=session_headers(key), json=big)
        assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
        r = client.post(
            "/v1/messages", headers=session_headers(key), json={**big, "model": "m", "max_tokens": 4}
        )
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

        def chunks():  # no Content-Length: the limit applies while reading
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"y" * 10_000
            yield b'"}]}'

        r = client.post(
            "/v1/chat/completions",
            headers={**session_headers(key), "content-type": "application/json"},
            content=chunks(),
        )
        assert r.status_code == 413
        assert (
            client.post("/v1/chat/completions", headers=session_headers(key), json=OK_CHAT).status_code == 200
        )


def test_unknown_fields_are_ignored(app_client):
    _, key = start_session(app_client)
    body = {
        **OK_CHAT,
        "model": "gpt-9",
        "user": "u",
        "seed": 3,
        "logit_bias": {},
        "parallel_tool_calls": False,
        "engine": 1,
        "cache": 2,
    }
    r = app_client.post("/v1/chat/completions", headers=session_headers(key), json=body)
    assert r.status_code == 200, r.text
    r = app_client.post(
        "/v1/messages",
        headers={"x-api-key": key},
        json={
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "top_k": 5,
            "metadata": {"user_id": "u"},
            "thinking": {"type": "disabled"},
        },
    )
    assert r.status_code == 200, r.text


def test_unknown_route_and_method_use_the_error_dialect(app_client):
    r = app_client.post("/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
    r = app_client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()

"""The auth matrix: every endpoint × no key / wrong key / admin key / session key / other
session's key, and session isolation (a key only ever reaches its own session)."""

from __future__ import annotations

import pytest

from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, session_headers, start_session

CHAT = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}
RESPONSES = {"input": "2+2?", "max_output_tokens": 8}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "2+2?"}]}
GENERATION = [
    ("/v1/chat/completions", CHAT),
    ("/chat/completions", CHAT),
    ("/v1/responses", RESPONSES),
    ("/responses", RESPONSES),
    ("/v1/messages", MESSAGES),
]


def _headers(kind: str, own: str, other: str) -> dict[str, str]:
    return {
        "none": {},
        "wrong": session_headers("not-a-real-key-123"),
        "admin": admin_headers(),
        "own": session_headers(own),
        "other": session_headers(other),
        "x-api-key": {"x-api-key": own},
        "malformed": {"Authorization": f"Basic {own}"},
    }[kind]


@pytest.mark.parametrize(
    "kind,status",
    [("none", 401), ("wrong", 403), ("own", 403), ("other", 403), ("malformed", 401), ("admin", 200)],
)
@pytest.mark.parametrize("path,body", [("/grant_capacity", None), ("/rl/start_session", {"task_id": "x"})])
def test_admin_endpoints(app_client, path, body, kind, status):
    _, own = start_session(app_client, "a")
    _, other = start_session(app_client, "b")
    app_client.post("/grant_capacity", headers=admin_headers())
    r = app_client.post(path, headers=_headers(kind, own, other), json=body)
    assert r.status_code == status, r.text
    if status != 200:
        assert r.json()["error"]["message"]
        assert r.json()["error"]["type"] in ("authentication_error", "permission_error")


@pytest.mark.parametrize(
    "kind,status", [("none", 401), ("wrong", 403), ("own", 403), ("other", 403), ("admin", 200)]
)
def test_export_needs_the_admin_key(app_client, kind, status):
    sid, own = start_session(app_client, "a")
    _, other = start_session(app_client, "b")
    assert app_client.post("/rl/end_session", headers=session_headers(own)).status_code == 200
    r = app_client.post("/export_trajectories", headers=_headers(kind, own, other), json={"session_id": sid})
    assert r.status_code == status, r.text
    # a refused export leaves the session exportable
    assert (sid in app_client.app.state.proxy.sessions) == (status != 200)


@pytest.mark.parametrize(
    "kind,status", [("none", 401), ("wrong", 401), ("admin", 401), ("own", 200), ("x-api-key", 200)]
)
@pytest.mark.parametrize(
    "path,body", [*GENERATION, ("/rl/end_session", None), ("/rl/set_reward", {"reward": 1.0})]
)
def test_session_endpoints(app_client, path, body, kind, status):
    _, own = start_session(app_client, "a")
    _, other = start_session(app_client, "b")
    if path == "/rl/set_reward":  # needs a call to reward
        assert (
            app_client.post("/v1/chat/completions", headers=session_headers(own), json=CHAT).status_code
            == 200
        )
    r = app_client.post(path, headers=_headers(kind, own, other), json=body)
    assert r.status_code == status, r.text
    if status == 401:
        err = r.json()["error"] if path != "/v1/messages" else r.json()["error"]
        assert err["type"] == "authentication_error"
        if path == "/v1/messages":
            assert r.json()["type"] == "error"


def test_admin_key_as_session_key_says_why(app_client):
    r = app_client.post("/v1/chat/completions", headers=admin_headers(), json=CHAT)
    assert r.status_code == 401
    assert "admin key is not a session key" in r.json()["error"]["message"]


def test_last_reward_while_the_only_call_is_generating_is_a_400_not_a_500(app_client):
    """A reward without an id goes to the most recently *completed* call; while the session's only
    call is still generating there is none (this was an unhandled RuntimeError: 500)."""
    from areal_nb.capture import InteractionWithTokenLogpReward

    sid, key = start_session(app_client, "r")
    cache = app_client.app.state.proxy.sessions[sid].cache
    cache["chatcmpl-pending"] = InteractionWithTokenLogpReward(
        messages=[{"role": "user", "content": "q"}], _interaction_id="chatcmpl-pending"
    )
    r = app_client.post("/rl/set_reward", headers=session_headers(key), json={"reward": 1.0})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == (
        "no completed interactions in session 'r-0' to reward: 1 call is still generating "
        "(set the reward once it returns, or by interaction_id)"
    )
    assert cache["chatcmpl-pending"].reward is None
    done = app_client.post("/v1/chat/completions", headers=session_headers(key), json=CHAT).json()["id"]
    assert (
        app_client.post("/rl/set_reward", headers=session_headers(key), json={"reward": 2.0}).status_code
        == 200
    )
    assert cache[done].reward == 2.0 and cache["chatcmpl-pending"].reward is None


def test_other_sessions_key_reaches_only_its_own_session(app_client):
    sid_a, key_a = start_session(app_client, "a")
    sid_b, key_b = start_session(app_client, "b")
    a_call = app_client.post("/v1/chat/completions", headers=session_headers(key_a), json=CHAT).json()["id"]
    # B cannot reward A's call: unknown in B's session
    r = app_client.post(
        "/rl/set_reward", headers=session_headers(key_b), json={"interaction_id": a_call, "reward": 5}
    )
    assert r.status_code == 400 and "not found in session 'b-0'" in r.json()["error"]["message"]
    # B's "last reward" with no calls of its own does not touch A
    r = app_client.post("/rl/set_reward", headers=session_headers(key_b), json={"reward": 5})
    assert r.status_code == 400 and "no interactions in session 'b-0'" in r.json()["error"]["message"]
    # ending B leaves A open
    assert app_client.post("/rl/end_session", headers=session_headers(key_b)).json()["interaction_count"] == 0
    assert (
        app_client.post("/v1/chat/completions", headers=session_headers(key_a), json=CHAT).status_code == 200
    )
    state = app_client.app.state.proxy
    assert state.sessions[sid_a].cache[a_call].reward is None
    assert len(state.sessions[sid_a].cache) == 2 and len(state.sessions[sid_b].cache) == 0
    # exporting B returns nothing of A
    r = app_client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid_b})
    assert r.status_code == 200 and r.json()["interactions"] == {}


def test_models_and_health_are_public(app_client):
    assert app_client.get("/health").json()["status"] == "ok"
    models = app_client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["areal-nb"]
    assert app_client.get("/models").json() == models
    assert PROXY_ADMIN_KEY not in app_client.get("/health").text

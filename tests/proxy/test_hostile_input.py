"""Hostile input, class by class, on the real tiny model through a real uvicorn server:
every bad request gets a clear 4xx in its route's dialect, records nothing, and leaves its own
session and everyone else's working. Ranges are explored with hypothesis."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_nb.api import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_TEMPERATURE, MIN_TEMPERATURE
from areal_nb.capture.templates import render_prompt_ids
from areal_nb.proxy.limits import MAX_JSON_DEPTH
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers
from tests.proxy.hostile import CONTEXT, HOSTILE, Hostile, chat, check_answer, encode, new_session_key, send

pytestmark = pytest.mark.slow

PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def client(local_server):
    with httpx.Client(base_url=local_server.url, timeout=60) as c:
        yield c


def _post(client: httpx.Client, key: str, path: str, body) -> httpx.Response:
    return client.post(
        path,
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
        content=encode(body),
    )


def _ok(client: httpx.Client, key: str) -> None:
    r = _post(client, key, "/v1/chat/completions", chat())
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_each_hostile_request_is_refused_clearly(local_server, client, case: Hostile):
    state = local_server.app.state.proxy
    sid, key = new_session_key(client)
    capacity = state.capacity
    check_answer(case, send(client, case, key))
    assert len(state.sessions[sid].cache) == 0  # nothing recorded
    assert state.capacity == capacity  # a refused start_session holds no slot
    _ok(client, key)  # the same session still works
    assert len(state.sessions[sid].cache) == 1


def test_errors_reach_the_sdks_as_bad_requests_without_retries(local_server):
    import anthropic
    import openai

    with httpx.Client(base_url=local_server.url) as c:
        _, key = new_session_key(c)
    oai = openai.OpenAI(base_url=f"{local_server.url}/v1", api_key=key, max_retries=2)
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {CONTEXT} tokens"):
        oai.chat.completions.create(
            model="tiny-math", messages=[{"role": "user", "content": "1+" * 3000}], max_tokens=4
        )
    with pytest.raises(openai.BadRequestError, match="frequency_penalty is not supported"):
        oai.chat.completions.create(
            model="tiny-math", messages=[{"role": "user", "content": "hi"}], max_tokens=4, frequency_penalty=1
        )
    ant = anthropic.Anthropic(base_url=local_server.url, api_key=key, max_retries=2)
    with pytest.raises(anthropic.BadRequestError, match="temperature must be 0"):
        ant.messages.create(
            model="tiny-math",
            max_tokens=4,
            extra_body={"temperature": 1e-300},
            messages=[{"role": "user", "content": "hi"}],
        )
    state = local_server.app.state.proxy
    assert sum(len(s.cache) for s in state.sessions.values() if s.api_key == key) == 0


# ---------------------------------------------------------------------------- class 1 + 2: sizes


@given(st.integers(0, 5000))
@PROPERTY
def test_prompt_length_either_fits_or_is_a_400_naming_the_context(client, tiny_tokenizer, n):
    content = ("12+" * n)[: n * 2]
    _, key = new_session_key(client)
    r = _post(client, key, "/v1/chat/completions", chat(content, max_tokens=1))
    tokens = len(render_prompt_ids(tiny_tokenizer, [{"role": "user", "content": content}]))
    if tokens < CONTEXT:
        assert r.status_code == 200, r.text
    else:
        message = r.json()["error"]["message"]
        # over the character bound: refused before tokenizing; else after, by token count
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert f"This model's maximum context length is {CONTEXT} tokens" in message, r.text


# ---------------------------------------------------------------------------- class 3: nesting


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@given(st.integers(1, 3 * MAX_JSON_DEPTH), st.sampled_from(["metadata", "tools", "content"]))
@PROPERTY
def test_nesting_up_to_the_limit_is_served_deeper_is_a_400(client, depth, where):
    from tests.proxy.hostile import nested

    inner = nested(depth)
    if where == "metadata":
        body = chat(metadata={"k": inner})
    elif where == "tools":
        body = chat(
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": inner}}}
            ]
        )
    else:
        body = chat([{"type": "text", "text": "hi", "extra": inner}])
    _, key = new_session_key(client)
    r = _post(client, key, "/v1/chat/completions", body)
    if _depth(body) > MAX_JSON_DEPTH:
        assert r.status_code == 400 and f"at most {MAX_JSON_DEPTH} levels" in r.json()["error"]["message"], (
            r.text
        )
    else:
        assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------- class 4: text

_TEXT = st.text(st.characters(codec=None, categories=None), max_size=12)  # surrogates included
_SURROGATE = re.compile("[\ud800-\udfff]")


@given(_TEXT, st.sampled_from(["content", "metadata", "name", "stop", "tool description"]))
@PROPERTY
def test_any_text_is_either_recorded_and_exportable_or_refused_at_the_door(client, text, where):
    body = chat("2+2?")
    if where == "content":
        body = chat("2+2?" + text)
    elif where == "metadata":
        body["metadata"] = {"note": text}
    elif where == "name":
        body["messages"][0]["name"] = text
    elif where == "stop":
        body["stop"] = ["<never>" + text]
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "description": text}}]
    sid, key = new_session_key(client)
    r = _post(client, key, "/v1/chat/completions", body)
    if _SURROGATE.search(text):
        assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text
        return
    assert r.status_code == 200, r.text
    assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
    exported = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert exported.status_code == 200, exported.text
    assert list(exported.json()["interactions"]) == [r.json()["id"]]


# ---------------------------------------------------------------------------- class 5: sampling


def _temperature_status(t: float) -> int:
    # Every range rule is GenerationConfig.check at the door: a value out of range is a 400
    # (invalid_request); only a wrong JSON type is the schema's 422.
    return 200 if t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE else 400


@given(
    st.one_of(
        st.floats(-1, 2 * MAX_TEMPERATURE, allow_nan=False),
        st.floats(0, 2 * MIN_TEMPERATURE, allow_subnormal=True),
        st.sampled_from([1e-300, 5e-324, 1e-45, 1e-8, MIN_TEMPERATURE, MAX_TEMPERATURE]),
    ),
    st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/responses"]),
)
@PROPERTY
def test_temperature_is_zero_or_in_range_on_every_route(client, t, path):
    body = {
        "/v1/chat/completions": chat(temperature=t),
        "/v1/responses": {"input": "hi", "max_output_tokens": 4, "temperature": t},
    }.get(
        path,
        {"model": "m", "max_tokens": 4, "temperature": t, "messages": [{"role": "user", "content": "hi"}]},
    )
    _, key = new_session_key(client)
    r = _post(client, key, path, body)
    assert r.status_code == _temperature_status(t), r.text


@given(st.floats(-0.5, 1.5, allow_nan=False))
@PROPERTY
def test_top_p_is_in_the_half_open_unit_interval(client, p):
    _, key = new_session_key(client)
    r = _post(client, key, "/v1/chat/completions", chat(top_p=p, temperature=1.0))
    assert r.status_code == (200 if 0 < p <= 1 else 400), r.text


@given(
    st.lists(
        st.text(st.characters(codec="utf-8"), max_size=MAX_STOP_STRING_CHARS + 8),
        max_size=MAX_STOP_STRINGS + 3,
    )
)
@PROPERTY
def test_stop_strings_are_bounded_and_non_empty(client, stops):
    _, key = new_session_key(client)
    r = _post(client, key, "/v1/chat/completions", chat(stop=stops))
    good = len(stops) <= MAX_STOP_STRINGS and all(0 < len(s) <= MAX_STOP_STRING_CHARS for s in stops)
    assert r.status_code == (200 if good else 400), r.text


# ---------------------------------------------------------------------------- class 7: export


def test_an_abandoned_waiting_export_leaves_the_session_exportable(client):
    sid, key = new_session_key(client, "abandon")
    first = _post(client, key, "/v1/chat/completions", chat())
    assert first.status_code == 200
    with pytest.raises(httpx.ReadTimeout):  # the client gives up on a waiting export
        client.post(
            "/export_trajectories",
            headers=admin_headers(),
            json={"session_id": sid, "wait_timeout": 30},
            timeout=0.5,
        )
    # the server notices the disconnect (polled every 0.25 s) and stops waiting without claiming
    assert client.post("/rl/set_reward", headers={"x-api-key": key}, json={"reward": 1.0}).status_code == 200
    assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
    exported = client.post(
        "/export_trajectories", headers=admin_headers(), json={"session_id": sid, "discount": 0.5}
    )
    assert exported.status_code == 200, exported.text
    wire = exported.json()["interactions"]
    assert list(wire) == [first.json()["id"]] and wire[first.json()["id"]]["reward"] == 1.0
    again = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert again.status_code == 404  # exported exactly once


# ---------------------------------------------------------------------------- class 9: keys

_KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


@given(
    st.text(st.characters(codec="utf-8"), max_size=20)
    | st.from_regex(r"[!-~][ -~]{6,18}[!-~]", fullmatch=True)
)
@PROPERTY
def test_a_requested_key_either_authenticates_or_is_refused(client, local_server, key):
    state = local_server.app.state.proxy
    assert client.post("/grant_capacity", headers=admin_headers()).status_code == 200
    capacity = state.capacity
    headers = {**admin_headers(), "content-type": "application/json"}
    r = client.post(
        "/rl/start_session", headers=headers, content=json.dumps({"task_id": "k", "api_key": key}).encode()
    )
    if len(key) < 8:
        assert r.status_code == 422, r.text
    elif not _KEY.fullmatch(key):
        assert r.status_code == 400 and "visible ASCII" in r.json()["error"]["message"], r.text
    elif key == PROXY_ADMIN_KEY:
        assert r.status_code == 400
    else:
        assert r.status_code == 200, r.text
        _ok(client, key)  # the key works as a bearer token
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        return
    assert state.capacity == capacity  # a refused key holds no slot

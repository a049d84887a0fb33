"""Fuzzing every endpoint with larger budgets than `test_app_schemathesis.py`:

- schemathesis over the OpenAPI schema, positive and negative cases, strings from all of
  Unicode (lone surrogates included: `codec=None`);
- a hypothesis fuzzer that takes a valid body of each route and puts arbitrary JSON — any
  Unicode text, huge and odd numbers, nesting up to 3× the depth limit — at a random place.

No request may cause a 5xx; every error carries a message in its route's dialect. The engine is
scripted (speed) but reports tiny-math's 512-token context, so the context-derived limits apply.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_nb.models import load_tokenizer
from areal_nb.proxy import ProxySettings, create_app
from areal_nb.proxy.limits import MAX_JSON_DEPTH
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY

ADMIN_PATHS = ("/grant_capacity", "/rl/start_session", "/export_trajectories")


def _app():
    tokenizer = load_tokenizer("tiny-math")
    engine = ScriptedEngine(tokenizer, "The answer is 4")
    engine.max_context = 512  # as LocalEngine("tiny-math") reports
    return create_app(
        engine, tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY, export_wait_timeout=0.05)
    )


app = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
schema.config.generation.update(codec=None, max_examples=80)  # any code point, surrogates too


def _credentials(path: str) -> dict[str, str]:
    if path in ADMIN_PATHS:
        return {"Authorization": f"Bearer {PROXY_ADMIN_KEY}"}
    state = app.state.proxy
    state.grant_capacity()
    return {"Authorization": f"Bearer {state.start_session('fuzz').api_key}"}


def _check(path: str, status: int, body: Any) -> None:
    assert status < 500, f"{path} → {status}: {str(body)[:500]}"
    if status >= 400:
        assert body["error"]["message"], body
        if path.startswith("/v1/messages"):
            assert body["type"] == "error", body


@pytest.mark.slow
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_schemathesis_unicode_no_server_errors(case):
    response = case.call(headers={**(case.headers or {}), **_credentials(case.path)})
    try:
        body = response.json() if response.content else {}
    except ValueError:  # a 200 stream (SSE) is not JSON; an error always is
        assert response.status_code < 400, response.text
        body = {}
    _check(case.path, response.status_code, body)


# ---------------------------------------------------------------------------- mutation fuzzer

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None), max_size=40)
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

VALID = {
    "/v1/chat/completions": {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}],
        "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "stop": ["\n\n"], "metadata": {"a": "b"},
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
    },
    "/v1/responses": {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "4"}],
        "instructions": "be brief", "max_output_tokens": 4, "tools": [{"type": "function", "name": "f", "parameters": {}}],
    },
    "/v1/messages": {
        "model": "m", "max_tokens": 4, "system": "be brief", "stop_sequences": ["##"],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "/rl/set_reward": {"reward": 1.0},
    "/rl/end_session": {},
    "/rl/start_session": {"task_id": "t", "api_key": "a-good-key-123"},
    "/grant_capacity": {"count": 1},
    "/export_trajectories": {"session_id": "fuzz-0", "discount": 0.9, "style": "individual", "wait_timeout": 0.05},
}  # fmt: skip


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON value where another value can go."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
        out.append((*prefix, "__new_key__"))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
        out.append((*prefix, len(value)))
    return out


def _put(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _put(value.get(head), rest, new)}
    if isinstance(value, list):
        copy = list(value)
        if head == len(copy):
            copy.append(new)
        else:
            copy[head] = _put(copy[head], rest, new)
        return copy
    return new


def _deep(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


@st.composite
def mutated_bodies(draw):
    path = draw(st.sampled_from(sorted(VALID)))
    body = VALID[path]
    where = draw(st.sampled_from(_paths(body)))
    new = _deep(draw(st.integers(0, 3 * MAX_JSON_DEPTH)), draw(_JSON)) if draw(st.booleans()) else draw(_JSON)
    return path, _put(body, where, new)


@pytest.fixture(scope="module")
def fuzz_client():
    with TestClient(_app()) as client:
        yield client


@given(mutated_bodies())
@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_mutated_bodies_never_cause_a_server_error(fuzz_client, case):
    path, body = case
    state = fuzz_client.app.state.proxy
    if path in ADMIN_PATHS:
        key = PROXY_ADMIN_KEY
        if path == "/export_trajectories":  # an ended session with a call in it, to export
            state.grant_capacity()
            session = state.start_session("fuzz")
            fuzz_client.post(
                "/v1/chat/completions",
                headers={"x-api-key": session.api_key},
                json={"messages": [{"role": "user", "content": "q"}], "max_tokens": 2},
            )
            state.end_session(session)
            if isinstance(body, dict) and body.get("session_id") == "fuzz-0":
                body = {**body, "session_id": session.session_id}
    else:
        state.grant_capacity()
        key = state.start_session("fuzz").api_key
    raw = json.dumps(body).encode()  # NaN/Infinity and \ud800 escapes as a careless client sends them
    response = fuzz_client.post(
        path, headers={"Authorization": f"Bearer {key}", "content-type": "application/json"}, content=raw
    )
    _check(path, response.status_code, response.json())

"""Input errors vs our own faults, the event loop under heavy input, failed exports, template
variables (no exception type is mapped to 400 wholesale)."""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

import httpx
import pytest

from areal_nb.api import InvalidRequestError
from areal_nb.capture.interaction import InteractionWithTokenLogpReward
from areal_nb.proxy import ProxyServer
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import (
    PROXY_ADMIN_KEY,
    SCRIPTED_REPLY,
    admin_headers,
    session_headers,
    start_session,
)

CHAT = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}


class SpyTokenizer:
    """The real tokenizer; `apply_chat_template` is counted and can be held on an Event."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.renders = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(
        self, conversation, tools=None, add_generation_prompt=False, tokenize=True, **kwargs
    ):
        self.renders += 1
        self.entered.set()
        assert self.release.wait(30)
        return self._tokenizer.apply_chat_template(
            conversation,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=tokenize,
            **kwargs,
        )


@pytest.mark.server
def test_rendering_a_long_conversation_runs_off_the_event_loop(tiny_tokenizer):
    from areal_nb.capture.completion import INLINE_RENDER_CHARS
    from areal_nb.proxy import ProxySettings, create_app

    spy = SpyTokenizer(tiny_tokenizer)
    spy.release.clear()
    app = create_app(ScriptedEngine(spy, SCRIPTED_REPLY), spy, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    # short conversations render in place (cheaper than a thread hop); long ones in a thread
    long_chat = {**CHAT, "messages": [{"role": "user", "content": "2+2? " * (INLINE_RENDER_CHARS // 4)}]}
    with ProxyServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        _, key = start_session(client)
        result: dict[str, Any] = {}
        slow = threading.Thread(
            target=lambda: result.setdefault(
                "r", client.post("/v1/chat/completions", headers=session_headers(key), json=long_chat)
            )
        )
        slow.start()
        assert spy.entered.wait(30)  # the template is being rendered right now ...
        with httpx.Client(base_url=server.url, timeout=30) as other:
            assert other.get("/health").status_code == 200  # ... and the loop still answers
            start_session(other, "other")
        spy.release.set()
        slow.join(30)
        assert result["r"].status_code == 200


def test_a_prompt_too_large_for_the_context_is_never_rendered(tiny_tokenizer):
    from fastapi.testclient import TestClient

    from areal_nb.proxy import ProxySettings, create_app

    spy = SpyTokenizer(tiny_tokenizer)
    engine = ScriptedEngine(spy, SCRIPTED_REPLY)
    engine.max_context = 512  # what LocalEngine reports
    app = create_app(engine, spy, ProxySettings(admin_api_key="k" * 16))
    with TestClient(app) as client:
        _, key = start_session(client, admin_key="k" * 16)
        big = {"messages": [{"role": "user", "content": "7+" * 100_000}], "max_tokens": 4}
        r = client.post("/v1/chat/completions", headers=session_headers(key), json=big)
        assert (
            r.status_code == 400
            and "could fit the model context of 512 tokens" in r.json()["error"]["message"]
        )
        assert spy.renders == 0


@pytest.fixture
def fresh_log_filter(monkeypatch):
    """The proxy logger's repeat filter, emptied: earlier tests' failures do not count."""
    import areal_nb.proxy.app as app_module
    from areal_nb.proxy.logs import RepeatFilter

    monkeypatch.setattr(app_module.logger, "filters", [RepeatFilter()])


def test_our_own_faults_are_500s_with_a_traceback_input_errors_400s(
    make_app, tiny_tokenizer, caplog, fresh_log_filter
):
    from fastapi.testclient import TestClient

    def script(req):
        text = tiny_tokenizer.decode(req.input_ids)
        if "TYPE" in text:
            raise TypeError("a bug in capture code")  # was mapped to 400 before
        if "BAD" in text:
            raise InvalidRequestError("the engine found an input error")
        return SCRIPTED_REPLY

    with (
        TestClient(make_app(ScriptedEngine(tiny_tokenizer, script))) as client,
        caplog.at_level(logging.ERROR),
    ):
        _, key = start_session(client)
        bug = client.post(
            "/v1/chat/completions",
            headers=session_headers(key),
            json={**CHAT, "messages": [{"role": "user", "content": "TYPE"}]},
        )
        assert bug.status_code == 500 and "TypeError: a bug in capture code" in bug.json()["error"]["message"]
        assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)  # traceback logged
        bad = client.post(
            "/v1/messages",
            headers=session_headers(key),
            json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "BAD"}]},
        )
        assert bad.status_code == 400 and bad.json()["error"] == {
            "type": "invalid_request_error",
            "message": "the engine found an input error",
        }


def test_a_failed_export_leaves_the_session_exportable_with_the_same_result(
    app_client, monkeypatch, caplog, fresh_log_filter
):
    sid, key = start_session(app_client)
    first = app_client.post("/v1/chat/completions", headers=session_headers(key), json=CHAT).json()
    follow = {
        **CHAT,
        "messages": [
            *CHAT["messages"],
            first["choices"][0]["message"],
            {"role": "user", "content": "and 3+3?"},
        ],
    }
    second = app_client.post("/v1/chat/completions", headers=session_headers(key), json=follow).json()
    app_client.post("/rl/set_reward", headers=session_headers(key), json={"reward": 1.0})
    app_client.post("/rl/end_session", headers=session_headers(key))

    real = InteractionWithTokenLogpReward.to_wire
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real(self)

    monkeypatch.setattr(InteractionWithTokenLogpReward, "to_wire", flaky)
    body = {"session_id": sid, "discount": 0.5}
    with caplog.at_level(logging.ERROR):
        failed = app_client.post("/export_trajectories", headers=admin_headers(), json=body)
    assert failed.status_code == 500 and "the session is kept" in failed.json()["error"]["message"]
    assert "export of session" in caplog.text
    ok = app_client.post("/export_trajectories", headers=admin_headers(), json=body)
    assert ok.status_code == 200, ok.text
    rewards = {iid: it["reward"] for iid, it in ok.json()["interactions"].items()}
    assert rewards == {first["id"]: 0.5, second["id"]: 1.0}  # discounted once, not twice
    assert app_client.post("/export_trajectories", headers=admin_headers(), json=body).status_code == 404


@pytest.fixture
def thinking_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = "{%- if enable_thinking -%}<think>{%- endif -%}" + tiny_tokenizer.chat_template
    return tokenizer


def test_only_the_templates_own_variables_are_accepted(thinking_tokenizer):
    from fastapi.testclient import TestClient

    from areal_nb.proxy import ProxySettings, create_app

    engine = ScriptedEngine(thinking_tokenizer, SCRIPTED_REPLY)
    app = create_app(engine, thinking_tokenizer, ProxySettings(admin_api_key="k" * 16))
    with TestClient(app) as client:
        _, key = start_session(client, admin_key="k" * 16)
        ok = client.post(
            "/v1/chat/completions",
            headers=session_headers(key),
            json={**CHAT, "chat_template_kwargs": {"enable_thinking": True}},
        )
        assert ok.status_code == 200, ok.text
        assert thinking_tokenizer.decode(engine.requests[-1].input_ids).startswith("<think>")
        for kwargs in (
            {"chat_template": "{{ 'x' }}"},
            {"tokenize": False},
            {"max_length": 3, "truncation": True},
            {"bos_token": "x"},
        ):
            r = client.post(
                "/v1/chat/completions",
                headers=session_headers(key),
                json={**CHAT, "chat_template_kwargs": kwargs},
            )
            assert (
                r.status_code == 400 and "allowed keys: ['enable_thinking']" in r.json()["error"]["message"]
            ), r.text
        assert len(engine.requests) == 1


def test_a_failure_repeated_on_every_request_is_logged_once_per_interval(
    make_app, tiny_tokenizer, caplog, fresh_log_filter
):
    from fastapi.testclient import TestClient

    def broken(req):
        raise RuntimeError("CUDA out of memory (simulated)")

    with (
        TestClient(make_app(ScriptedEngine(tiny_tokenizer, broken))) as client,
        caplog.at_level(logging.ERROR),
    ):
        _, key = start_session(client)
        statuses = [
            client.post("/v1/chat/completions", headers=session_headers(key), json=CHAT).status_code
            for _ in range(20)
        ]
    assert statuses == [500] * 20  # every request answered
    logged = [r for r in caplog.records if r.getMessage().startswith("generation failed")]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError  # one traceback, 19 left out

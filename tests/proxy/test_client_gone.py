"""A client that goes away while its reply is being generated (a timeout, a killed agent, a
hostile fire-and-forget flood) stops its generation: the engine's row is cancelled, nothing is
recorded for the reply nobody received, and the session and everyone else go on. Real uvicorn on
loopback; the engine holds marked prompts until cancelled, so the test does not race a model."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from areal_nb.proxy import ProxyServer
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, session_headers, start_session

pytestmark = pytest.mark.server

OK = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}
ROUTES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "HOLD"}], "max_tokens": 8},
    "/v1/responses": {"input": "HOLD", "max_output_tokens": 8},
    "/v1/messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "HOLD"}]},
}


class HoldingEngine(ScriptedEngine):
    """Answers at once, except prompts containing HOLD: those wait until cancelled."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, "The answer is 4")
        self.held = 0
        self.cancelled = 0

    async def agenerate(self, req):
        if "HOLD" not in self.tokenizer.decode(req.input_ids):
            return await super().agenerate(req)
        self.held += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@pytest.fixture(scope="module")
def served(tiny_tokenizer):
    from areal_nb.proxy import ProxySettings, create_app

    engine = HoldingEngine(tiny_tokenizer)
    with ProxyServer(
        create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    ) as server:
        yield server, engine


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_gone_client_cancels_its_generation_and_records_nothing(served, path):
    server, engine = served
    with httpx.Client(base_url=server.url, timeout=30) as client:
        sid, key = start_session(client, "gone")
        held, cancelled = engine.held, engine.cancelled
        body = json.dumps(ROUTES[path]).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            _wait_for(lambda: engine.held == held + 1)  # generating
        _wait_for(lambda: engine.cancelled == cancelled + 1)  # the client closed: the row is cancelled
        state = server.app.state.proxy
        assert len(state.sessions[sid].cache) == 0
        ok = client.post("/v1/chat/completions", headers=session_headers(key), json=OK)
        assert ok.status_code == 200, ok.text
        assert list(state.sessions[sid].cache) == [ok.json()["id"]]


def test_a_flood_of_abandoned_requests_leaves_nothing_running(served):
    server, engine = served
    with httpx.Client(base_url=server.url, timeout=30) as client:
        sid, key = start_session(client, "flood")
        cancelled = engine.cancelled
        body = json.dumps(ROUTES["/v1/chat/completions"]).encode()
        host, port = server.url.removeprefix("http://").split(":")
        socks = []
        for _ in range(20):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            socks.append(sock)
        _wait_for(lambda: engine.held - engine.cancelled >= 20)
        for sock in socks:
            sock.close()
        _wait_for(lambda: engine.cancelled == cancelled + 20)
        assert engine.held == engine.cancelled  # nothing left generating for nobody
        assert len(server.app.state.proxy.sessions[sid].cache) == 0


def test_a_gone_client_leaves_no_error_in_the_log(served, caplog):
    import logging

    server, engine = served
    with caplog.at_level(logging.ERROR), httpx.Client(base_url=server.url, timeout=30) as client:
        _, key = start_session(client, "quiet")
        cancelled = engine.cancelled
        body = json.dumps(ROUTES["/v1/chat/completions"]).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            _wait_for(lambda: engine.held == engine.cancelled + 1)
        _wait_for(lambda: engine.cancelled == cancelled + 1)
        time.sleep(0.2)  # the handler answers after the cancellation settles
    assert "generation failed" not in caplog.text and "Traceback" not in caplog.text, caplog.text

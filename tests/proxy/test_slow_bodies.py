"""Slow-loris bodies on the real proxy (real model, real uvicorn on loopback): a client that sends
its headers and then trickles or withholds the body gets a 408 once `body_timeout` has passed and
its connection is closed; nobody else waits for it meanwhile."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from areal_nb.proxy import ProxyServer
from tests.proxy.hostile import chat, new_session_key

pytestmark = pytest.mark.server

BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def slow_server(local_engine, tiny_tokenizer):
    from areal_nb.proxy import ProxySettings, create_app
    from tests.proxy.conftest import PROXY_ADMIN_KEY

    app = create_app(
        local_engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY, body_timeout=BODY_TIMEOUT)
    )
    with ProxyServer(app) as server:
        yield server


def _loris(server, key: str, sent: bytes, length: int) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()
    sock.sendall(head + sent)
    return sock


def _read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:  # closed while our unsent bytes were still arriving
            return data
        if not chunk:  # the server closed the connection
            return data
        data += chunk


@pytest.mark.parametrize("trickle", [False, True], ids=["withheld", "trickled"])
def test_a_body_that_does_not_arrive_in_time_is_a_408_and_the_connection_closes(slow_server, trickle):
    with httpx.Client(base_url=slow_server.url, timeout=30) as client:
        sid, key = new_session_key(client)
        body = json.dumps(chat()).encode()
        sock = _loris(slow_server, key, body[:10], len(body))
        started = time.monotonic()
        if trickle:  # one byte every 0.2 s: each read is quick, the whole body never completes in time
            for byte in body[10:20]:
                time.sleep(0.2)
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # the server answered and closed meanwhile
                    break
        answer = _read_all(sock, timeout=BODY_TIMEOUT + 10)
        waited = time.monotonic() - started
        sock.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        error = json.loads(payload)["error"]
        assert error["code"] == "body_timeout" and f"{BODY_TIMEOUT:g} s" in error["message"]
        assert waited >= BODY_TIMEOUT * 0.9
        assert len(slow_server.app.state.proxy.sessions[sid].cache) == 0  # nothing recorded
        ok = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat())
        assert ok.status_code == 200, ok.text  # the same session still works


def test_honest_clients_are_served_while_many_bodies_hang(slow_server):
    with httpx.Client(base_url=slow_server.url, timeout=30) as client:
        _, key = new_session_key(client)
        socks = [_loris(slow_server, key, b'{"messages":', 1000) for _ in range(50)]
        try:
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            ok = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat())
            assert ok.status_code == 200, ok.text
            assert time.monotonic() - started < BODY_TIMEOUT  # served before any hanging body timed out
            answers = [_read_all(s, timeout=BODY_TIMEOUT + 10) for s in socks]
        finally:
            for s in socks:
                s.close()
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers)

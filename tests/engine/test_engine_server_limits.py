"""`areal-nb engine-server` against hostile bodies, on the real tiny model over loopback: oversized
and slow bodies, wrong types that lax parsing would coerce, options it cannot honour, versions
that would read as prompt tokens. Each is a 4xx in sglang's error shape and the server keeps
serving everyone else."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.proxy import ProxyServer

pytestmark = pytest.mark.server

LIMIT = 64 * 1024
BODY_TIMEOUT = 1.0
OK = {
    "input_ids": [5, 17, 42],
    "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def server(local_engine):
    settings = EngineServerSettings(max_body_bytes=LIMIT, body_timeout=BODY_TIMEOUT)
    with ProxyServer(create_engine_app(local_engine, settings)) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _still_serving(client) -> None:
    reply = client.post("/generate", json=OK)
    assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 3, reply.text


@pytest.mark.parametrize("path", ["/generate", "/abort_request"])
def test_an_oversized_body_is_a_413_declared_or_streamed(client, path):
    big = {**OK, "pad": "x" * LIMIT}
    reply = client.post(path, json=big)
    assert reply.status_code == 413 and f"the limit is {LIMIT} bytes" in reply.json()["error"]["message"]
    chunked = client.post(
        path, content=iter([json.dumps(big).encode()]), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413, chunked.text
    _still_serving(client)


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_others_are_served_meanwhile(server, client):
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"
    )
    started = time.monotonic()
    _still_serving(client)
    assert time.monotonic() - started < BODY_TIMEOUT
    sock.settimeout(BODY_TIMEOUT + 10)
    answer = b""
    while chunk := sock.recv(65536):  # read until the server closes the connection
        answer += chunk
    sock.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert f"not complete {BODY_TIMEOUT:g} s after its headers" in json.loads(payload)["error"]["message"]
    assert time.monotonic() - started >= BODY_TIMEOUT * 0.9


@pytest.mark.parametrize(
    "body,needle",
    [
        ({**OK, "sampling_params": {"max_new_tokens": 3, "temperature": True}}, "temperature"),
        ({**OK, "sampling_params": {"max_new_tokens": 3, "top_p": "0.5"}}, "top_p"),
        ({**OK, "return_logprob": "yes"}, "return_logprob"),
        ({**OK, "stream": 1}, "stream"),
        ({**OK, "logprob_start_len": "-1"}, "logprob_start_len"),
    ],
    ids=[
        "temperature-true",
        "top_p-string",
        "return_logprob-string",
        "stream-int",
        "logprob_start_len-string",
    ],
)
def test_wrong_types_are_400s_not_coerced(client, body, needle):
    reply = client.post("/generate", json=body)
    assert reply.status_code == 400 and needle in reply.json()["error"]["message"], reply.text
    _still_serving(client)


def test_top_logprobs_are_refused_not_silently_missing(client):
    reply = client.post("/generate", json={**OK, "return_logprob": True, "top_logprobs_num": 5})
    assert reply.status_code == 400 and "top_logprobs_num=0" in reply.json()["error"]["message"], reply.text
    reply = client.post("/generate", json={**OK, "return_logprob": True, "top_logprobs_num": 0})
    assert reply.status_code == 200 and len(reply.json()["meta_info"]["output_token_logprobs"]) == 3


@pytest.mark.parametrize(
    "path,body",
    [
        ("/update_weight_version", {"new_version": "-5"}),
        ("/update_weights_from_disk", {"model_path": "x", "weight_version": "-1"}),
    ],
)
def test_a_negative_weight_version_is_refused(local_engine, client, path, body):
    before = local_engine.get_version()
    reply = client.post(path, json=body)
    assert reply.status_code == 400 and ">= 0" in reply.text, reply.text
    assert local_engine.get_version() == before
    _still_serving(client)


class _HoldingEngine:
    """The real engine, except that prompts starting with token 7 wait until cancelled."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.held = self.cancelled = 0
        self.aborted: list[str] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        self._engine.abort(rid)

    async def agenerate(self, req):
        if req.input_ids[0] != 7:
            return await self._engine.agenerate(req)
        import asyncio

        self.held += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_a_client_that_leaves_has_its_generation_aborted(local_engine):
    engine = _HoldingEngine(local_engine)
    with ProxyServer(create_engine_app(engine, EngineServerSettings())) as served:
        body = json.dumps(
            {"input_ids": [[7, 1], [7, 2]], "rid": "gone", "sampling_params": {"max_new_tokens": 3}}
        ).encode()
        host, port = served.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            _wait(lambda: engine.held == 2)
        _wait(lambda: engine.cancelled == 2)
        assert sorted(engine.aborted) == ["gone_0", "gone_1"]
        with httpx.Client(base_url=served.url, timeout=60) as client:
            _still_serving(client)
            again = client.post("/generate", json={**OK, "rid": "gone_0"})  # the rids were released
            assert again.status_code == 200, again.text


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

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
OK = {"input_ids": [5, 17, 42], "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}}


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
    chunked = client.post(path, content=iter([json.dumps(big).encode()]), headers={"content-type": "application/json"})
    assert chunked.status_code == 413, chunked.text
    _still_serving(client)


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_others_are_served_meanwhile(server, client):
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
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


@pytest.mark.parametrize("body,needle", [
    ({**OK, "sampling_params": {"max_new_tokens": 3, "temperature": True}}, "temperature"),
    ({**OK, "sampling_params": {"max_new_tokens": 3, "top_p": "0.5"}}, "top_p"),
    ({**OK, "return_logprob": "yes"}, "return_logprob"),
    ({**OK, "stream": 1}, "stream"),
    ({**OK, "logprob_start_len": "-1"}, "logprob_start_len"),
], ids=["temperature-true", "top_p-string", "return_logprob-string", "stream-int", "logprob_start_len-string"])
def test_wrong_types_are_400s_not_coerced(client, body, needle):
    reply = client.post("/generate", json=body)
    assert reply.status_code == 400 and needle in reply.json()["error"], reply.text
    _still_serving(client)


def test_top_logprobs_are_refused_not_silently_missing(client):
    reply = client.post("/generate", json={**OK, "return_logprob": True, "top_logprobs_num": 5})
    assert reply.status_code == 400 and "top_logprobs_num=0" in reply.json()["error"]["message"], reply.text
    reply = client.post("/generate", json={**OK, "return_logprob": True, "top_logprobs_num": 0})
    assert reply.status_code == 200 and len(reply.json()["meta_info"]["output_token_logprobs"]) == 3


@pytest.mark.parametrize("path,body", [
    ("/update_weight_version", {"new_version": "-5"}),
    ("/update_weights_from_disk", {"model_path": "x", "weight_version": "-1"}),
])
def test_a_negative_weight_version_is_refused(local_engine, client, path, body):
    before = local_engine.get_version()
    reply = client.post(path, json=body)
    assert reply.status_code == 400 and ">= 0" in reply.text, reply.text
    assert local_engine.get_version() == before
    _still_serving(client)

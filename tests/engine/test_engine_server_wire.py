"""The engine-server's wire format through the real client: log-probs arrive bit-exact, cancelled
callers free the server, /generate's plain ASGI route answers like the FastAPI routes.

engine-server encodes /generate replies with orjson, as sglang does, which writes a -inf log-prob
as null; `SGLangEngine` reads that back as -inf. A scripted engine stands in for the model, so the
values are known.
"""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest
from engine_test_helpers import ServedStub

from areal_nb.api import GenerationConfig, ModelRequest, ModelResponse
from areal_nb.engine.remote import SGLangEngine
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.proxy.server import ProxyServer

pytestmark = pytest.mark.server

KEY = "wire-key"


class ScriptedLogprobs(ServedStub):
    """Answers every request with tokens 10, 11, ... and the log-probs it was given."""

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        n = len(self.logprobs)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=[10 + i for i in range(n)],
            output_logprobs=list(self.logprobs),
            output_versions=[0] * n,
            stop_reason="length",
        )


@pytest.mark.parametrize(
    "logprobs",
    [
        [-0.1, -2.718281828459045, -1e-12, -37.25],
        [-0.5, -math.inf, -3.0],  # null on the wire
    ],
    ids=["finite", "non-finite"],
)
def test_logprobs_arrive_exactly(logprobs):
    server = ProxyServer(
        create_engine_app(ScriptedLogprobs(logprobs), EngineServerSettings(api_key=KEY))
    ).start()
    client = SGLangEngine([server.url], api_key=KEY, eos_token_ids=[2])
    try:
        request = ModelRequest(input_ids=[5, 6, 7], gconfig=GenerationConfig(max_new_tokens=len(logprobs)))
        response = asyncio.run(client.agenerate(request))
        assert response.output_tokens == [10 + i for i in range(len(logprobs))]
        assert response.output_logprobs == logprobs  # bit-exact floats, -inf included
        assert response.stop_reason == "length"
    finally:
        client.close()
        server.stop()


class Slow(ServedStub):
    """Generates until aborted (`/abort_request`); records which rids started and which were aborted."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.aborted: list[str] = []
        self._stop: dict[str, asyncio.Event] = {}

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.started.append(req.rid)
        self._stop[req.rid] = asyncio.Event()
        await asyncio.wait_for(self._stop[req.rid].wait(), timeout=30)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=[7],
            output_logprobs=[-1.0],
            output_versions=[0],
            stop_reason="abort",
        )

    def abort(self, rid: str) -> None:  # called on the server's loop
        self.aborted.append(rid)
        self._stop[rid].set()


def test_cancelling_callers_of_a_burst_frees_the_server_and_the_client_keeps_working():
    engine = Slow()
    server = ProxyServer(create_engine_app(engine, EngineServerSettings())).start()
    client = SGLangEngine([server.url], eos_token_ids=[2])

    async def burst_then_cancel() -> None:
        tasks = [
            asyncio.ensure_future(
                client.agenerate(ModelRequest(input_ids=[5, 6], gconfig=GenerationConfig(max_new_tokens=1)))
            )
            for _ in range(5)
        ]
        while len(engine.started) < 5:  # all five reached the engine (started on the client's loop in one go)
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)

    try:
        asyncio.run(asyncio.wait_for(burst_then_cancel(), timeout=20))
        for _ in range(200):  # the client's loop sends /abort_request for each cancelled request
            if client.server_status()[0]["in_flight"] == 0 and len(set(engine.aborted)) == 5:
                break
            time.sleep(0.05)
        assert client.server_status()[0]["in_flight"] == 0
        # each row is aborted by the client's /abort_request and, when its connection drops, by the
        # server itself (as sglang does); aborting a finished row again is a no-op
        assert sorted(set(engine.aborted)) == sorted(engine.started)
        # a caller that gives up before its request even left the client: nothing reaches the server
        asyncio.run(_cancel_at_once(client))
        assert len(engine.started) == 5
    finally:
        client.close()
        server.stop()


async def _cancel_at_once(client: SGLangEngine) -> None:
    task = asyncio.ensure_future(
        client.agenerate(ModelRequest(input_ids=[5], gconfig=GenerationConfig(max_new_tokens=1)))
    )
    await asyncio.sleep(0)  # submitted to the client's loop, which has not started it yet (or just has)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_generate_answers_405_to_other_methods_and_other_routes_still_work():
    server = ProxyServer(
        create_engine_app(ScriptedLogprobs([-1.0]), EngineServerSettings(api_key=KEY))
    ).start()
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{server.url}/generate", headers=headers).status_code == 405
        assert httpx.post(f"{server.url}/generate", json={"input_ids": [5]}).status_code == 401  # key first
        reply = httpx.put(
            f"{server.url}/generate",
            headers=headers,
            json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1}},
        )
        assert reply.status_code == 200 and reply.json()["output_ids"] == [10]
        bad = httpx.post(f"{server.url}/generate", headers=headers, content=b"[1, 2]")
        assert bad.status_code == 400 and bad.json() == {
            "error": {"message": "request body must be a JSON object", "code": 400}
        }
        assert httpx.get(f"{server.url}/model_info", headers=headers).json()["weight_version"] == "0"
    finally:
        server.stop()

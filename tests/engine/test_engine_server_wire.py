"""The engine-server's wire format through the real client: log-probs arrive bit-exact.

engine-server encodes /generate replies with orjson, as sglang does, which writes a -inf log-prob
as null; `SGLangEngine` reads that back as -inf. A scripted engine stands in for the model, so the
values are known.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from areal_nb.api import GenerationConfig, ModelRequest, ModelResponse
from areal_nb.engine.remote import SGLangEngine
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.proxy.server import ProxyServer

pytestmark = pytest.mark.server

KEY = "wire-key"


class ScriptedLogprobs:
    """Answers every request with tokens 10, 11, ... and the log-probs it was given."""

    tokenizer = None
    eos_token_ids = [2]
    max_context = 512

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        n = len(self.logprobs)
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=[10 + i for i in range(n)],
                             output_logprobs=list(self.logprobs), output_versions=[0] * n, stop_reason="length")

    def get_version(self) -> int:
        return 0

    def abort(self, rid: str) -> None:
        pass

    def abort_all(self) -> None:
        pass


@pytest.mark.parametrize("logprobs", [
    [-0.1, -2.718281828459045, -1e-12, -37.25],
    [-0.5, -math.inf, -3.0],  # null on the wire
], ids=["finite", "non-finite"])
def test_logprobs_arrive_exactly(logprobs):
    server = ProxyServer(create_engine_app(ScriptedLogprobs(logprobs), EngineServerSettings(api_key=KEY))).start()
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

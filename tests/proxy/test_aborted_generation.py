"""A generation the engine aborted (a server that dropped it, an operator's abort) is refused on
every door in its own dialect: 503 `generation_aborted` with `Retry-After`, nothing recorded, so
the SDK retries and the retry is answered; never a cut reply passed off as complete. AReaL's
in-process client still returns it whole."""

from __future__ import annotations

import asyncio
import dataclasses

import anthropic
import httpx
import openai
import pytest

from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, SCRIPTED_REPLY, admin_headers, start_session

pytestmark = pytest.mark.server  # a real proxy on loopback


class AbortsFirst(ScriptedEngine):
    """Aborts the first `aborts` generations after two tokens, then answers as scripted."""

    aborts = 0

    async def agenerate(self, req):
        response = await super().agenerate(req)
        if self.aborts > 0:
            self.aborts -= 1
            cut = response.output_tokens[:2]
            response = dataclasses.replace(
                response,
                output_tokens=cut,
                output_logprobs=response.output_logprobs[:2],
                output_versions=response.output_versions[:2],
                stop_reason="abort",
            )
        return response


@pytest.fixture
def proxy(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    engine = AbortsFirst(tiny_tokenizer, SCRIPTED_REPLY)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with ProxyServer(app) as server, httpx.Client(base_url=server.url) as client:
        sid, key = start_session(client)
        yield server.url, engine, key
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        exported = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
        # only the answered retries were recorded, each whole
        for item in exported.json()["interactions"].values():
            assert item["model_response"]["stop_reason"] != "abort"


CALLS = {
    "chat": lambda url, key, retries: openai.OpenAI(
        base_url=f"{url}/v1", api_key=key, max_retries=retries
    ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=32),
    "responses": lambda url, key, retries: openai.OpenAI(
        base_url=f"{url}/v1", api_key=key, max_retries=retries
    ).responses.create(model="m", input="hi", max_output_tokens=32),
    "messages": lambda url, key, retries: anthropic.Anthropic(
        base_url=url, api_key=key, max_retries=retries
    ).messages.create(model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}]),
}


@pytest.mark.filterwarnings("ignore:.*leaf interaction.*no reward set")
@pytest.mark.parametrize("door", CALLS)
def test_an_aborted_generation_is_a_503_in_the_doors_dialect_and_a_retry_is_answered(proxy, door):
    url, engine, key = proxy
    engine.aborts = 1
    sdk = anthropic if door == "messages" else openai
    with pytest.raises(sdk.InternalServerError) as caught:
        CALLS[door](url, key, 0)
    error = caught.value
    assert error.status_code == 503 and error.response.headers["retry-after"] == "1"
    if door == "messages":
        assert error.body["type"] == "error" and error.body["error"]["type"] == "api_error"
        assert "the engine aborted this generation after 2 tokens" in error.body["error"]["message"]
    else:
        assert error.code == "generation_aborted" and error.type == "server_error"
    # the SDK retries a 503 by itself (after Retry-After): the retry is answered whole
    engine.aborts = 1
    reply = CALLS[door](url, key, 1)
    text = (
        reply.content[0].text
        if door == "messages"
        else (reply.output_text if door == "responses" else reply.choices[0].message.content)
    )
    assert text == SCRIPTED_REPLY and engine.aborts == 0


def test_areal_openai_returns_an_aborted_generation_whole(tiny_tokenizer):
    from areal_nb.capture.client import ArealOpenAI

    engine = AbortsFirst(tiny_tokenizer, SCRIPTED_REPLY)
    engine.aborts = 1
    client = ArealOpenAI(engine=engine, tokenizer=tiny_tokenizer)
    completion = asyncio.run(
        client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    )
    assert client.cache[completion.id].model_response.stop_reason == "abort"

"""An engine server's 400 reaches the agent as a 400: a real `areal-nb engine-server` refuses a
request, `SGLangEngine` raises `EngineRefused`, and the proxy answers the OpenAI SDK with
`BadRequestError` naming the server's reason (not a 500 `generation_failed`). A prompt the server
refuses for the model's context is a `ContextLengthExceeded`, which the agent's SDK gets as
`context_length_exceeded` in its door's words."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from servers import API_KEY, start_engine_server

from areal_nb.api import GenerationConfig, InvalidRequestError, ModelRequest
from areal_nb.engine.remote import EngineRefused, SGLangEngine
from areal_nb.errors import ContextLengthExceeded
from tests.proxy.conftest import PROXY_ADMIN_KEY, start_session

pytestmark = pytest.mark.server  # an engine-server subprocess and a proxy on loopback


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    proc = start_engine_server(tmp_path_factory.mktemp("refusals"))
    yield proc
    proc.stop()


def test_a_refused_generate_is_an_invalid_request(engine_server):
    engine = SGLangEngine(engine_server.url, api_key=API_KEY)
    try:
        # tiny-math's context is 512 tokens: the server refuses 600 new tokens with a 400
        request = ModelRequest([5, 17, 42], GenerationConfig(max_new_tokens=600))
        with pytest.raises(EngineRefused, match="maximum context length of 512 tokens") as caught:
            asyncio.run(engine.agenerate(request))
        assert isinstance(caught.value, InvalidRequestError) and isinstance(caught.value, ValueError)
        assert caught.value.status == 400
    finally:
        engine.close()


def test_the_agent_gets_the_servers_400_through_the_proxy(engine_server, tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    # no max_context given: the proxy cannot know the model's context, so only the server refuses
    engine = SGLangEngine(engine_server.url, api_key=API_KEY, tokenizer=tiny_tokenizer)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    try:
        with ProxyServer(app) as server:
            with httpx.Client(base_url=server.url) as admin:
                _, key = start_session(admin)
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    model="tiny-math", messages=[{"role": "user", "content": "1+1="}], max_tokens=600
                )
            assert caught.value.status_code == 400
            message = caught.value.message
            assert "rejected the request" in message
            assert "exceeds the model's maximum context length of 512 tokens" in message
            assert "generation_failed" not in str(caught.value.body)
            # the server is still serving: a request it can honour goes through
            reply = client.chat.completions.create(
                model="tiny-math", messages=[{"role": "user", "content": "1+1="}], max_tokens=4
            )
            assert reply.choices[0].message.content is not None
    finally:
        engine.close()


def test_a_prompt_over_the_servers_context_is_a_context_overflow(engine_server):
    engine = SGLangEngine(engine_server.url, api_key=API_KEY)  # no max_context: the server's words tell
    try:
        request = ModelRequest([7] * 600, GenerationConfig(max_new_tokens=4))
        with pytest.raises(ContextLengthExceeded) as caught:
            asyncio.run(engine.agenerate(request))
        overflow = caught.value
        assert (overflow.tokens, overflow.context, overflow.at_least) == (600, 512, False)
        assert "the engine server refused it: Requested token count exceeds" in overflow.detail
    finally:
        engine.close()


def test_the_agent_gets_the_servers_context_refusal_as_context_length_exceeded(engine_server, tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    # no max_context: the proxy does not check the context, the server refuses the prompt
    engine = SGLangEngine(engine_server.url, api_key=API_KEY, tokenizer=tiny_tokenizer)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    try:
        with ProxyServer(app) as server:
            with httpx.Client(base_url=server.url) as admin:
                _, key = start_session(admin)
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.BadRequestError) as chat:
                client.chat.completions.create(
                    model="tiny-math", messages=[{"role": "user", "content": "1+" * 3_000}], max_tokens=4
                )
            assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"
            assert chat.value.body["message"].startswith(
                "This model's maximum context length is 512 tokens. However, your messages resulted in 6008 "
                "tokens."
            )
            with pytest.raises(openai.BadRequestError) as text:
                client.completions.create(model="tiny-math", prompt=[7] * 600, max_tokens=4)
            assert text.value.code == "context_length_exceeded" and text.value.param == "prompt"
            assert text.value.body["message"].startswith(
                "This model's maximum context length is 512 tokens, however you requested 601 tokens "
                "(600 in your prompt; 1 for the completion)."
            )
    finally:
        engine.close()

"""OpenAIProxyClient against a real proxy on loopback (ScriptedEngine: replies are fixed text)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI

from areal_nb.errors import InvalidArgumentError
from areal_nb.proxy.client import OpenAIProxyClient, ProxyRequestError, RetryPolicy
from areal_nb.testing import ScriptedEngine
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

pytestmark = pytest.mark.server  # real uvicorn servers on loopback


@pytest.fixture(scope="module")
def proxy(tiny_tokenizer):
    with serve_proxy(ScriptedEngine(tiny_tokenizer, "The answer is 7"), tiny_tokenizer) as p:
        yield p


async def _chat(url: str, key: str, content: str) -> str:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        completion = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": content}]
        )
    assert completion.choices[0].message.content == "The answer is 7"
    return completion.id


def test_full_lifecycle_rewards_and_export(proxy):
    async def episode():
        client = OpenAIProxyClient(proxy.url, ADMIN_KEY, "life")
        assert await client.grant_capacity() >= 1
        async with client:
            assert client.session_id.startswith("life-")
            first = await _chat(proxy.url, client.session_api_key, "1+6?")
            second = await _chat(proxy.url, client.session_api_key, "2+5?")
            await client.set_reward(first, 0.25)
            await client.set_last_reward(1)
        assert client.session_ended
        out = await client.export_interactions(discount=1.0)
        await client.aclose()
        return first, second, out

    first, second, out = asyncio.run(episode())
    assert list(out) == [first, second]
    assert out[first].reward == 0.25 and out[second].reward == 1.0
    row = out[second].to_tensor_dict()
    assert row["rewards"].tolist() == [1.0]
    assert int(row["loss_mask"].sum()) == len(out[second].model_response.output_tokens)
    assert live_sessions(proxy.app) == ({}, {})


def test_end_session_runs_even_when_the_block_raises(proxy):
    async def episode():
        client = OpenAIProxyClient(proxy.url + "/v1", ADMIN_KEY, "boom")  # a /v1 suffix is tolerated
        await client.grant_capacity()
        with pytest.raises(RuntimeError, match="agent failed"):
            async with client:
                await _chat(proxy.url, client.session_api_key, "hi")
                raise RuntimeError("agent failed")
        assert client.session_ended
        out = await client.export_interactions()
        await client.aclose()
        return out

    out = asyncio.run(episode())
    assert len(out) == 1
    assert live_sessions(proxy.app) == ({}, {})


def test_start_session_retries_are_bounded_on_429(proxy):
    async def no_capacity():
        client = OpenAIProxyClient(proxy.url, ADMIN_KEY, "full", start_attempts=3, retry_delay=0.01)
        with pytest.raises(ProxyRequestError) as err:
            async with client:
                pass
        return err.value

    err = asyncio.run(no_capacity())
    assert err.status == 429 and err.endpoint == "rl/start_session"


def test_start_session_succeeds_once_capacity_arrives(proxy):
    async def late_capacity():
        client = OpenAIProxyClient(proxy.url, ADMIN_KEY, "late", start_attempts=400, retry_delay=0.05)
        granter = OpenAIProxyClient(proxy.url, ADMIN_KEY, "granter")

        async def grant_later():
            await asyncio.sleep(0.2)
            await granter.grant_capacity()

        task = asyncio.create_task(grant_later())
        async with client:
            sid = client.session_id
        await task
        await client.export_interactions()
        await granter.aclose()
        await client.aclose()
        return sid

    assert asyncio.run(late_capacity()).startswith("late-")
    assert live_sessions(proxy.app) == ({}, {})


def test_wrong_admin_key_fails_at_once_without_retries(proxy):
    async def wrong_key():
        client = OpenAIProxyClient(proxy.url, "not-the-admin-key", "x", start_attempts=50, retry_delay=5.0)
        with pytest.raises(ProxyRequestError) as err:
            await client.grant_capacity()
        return err.value

    err = asyncio.run(asyncio.wait_for(wrong_key(), 10))
    assert err.status == 403 and not err.retryable


def test_unreachable_proxy_is_a_bounded_connection_error():
    async def down():
        client = OpenAIProxyClient("http://127.0.0.1:9", ADMIN_KEY, "x", start_attempts=2, retry_delay=0.01)
        with pytest.raises(ProxyRequestError) as err:
            async with client:
                pass
        return err.value

    err = asyncio.run(down())
    assert err.status is None and "ConnectError" in err.detail


def test_retry_settings_are_checked_and_kept_together():
    client = OpenAIProxyClient("http://127.0.0.1:9/v1", ADMIN_KEY, "x", start_attempts=2, export_timeout=5.0)
    assert client.base_url == "http://127.0.0.1:9"
    assert client.retry == RetryPolicy(start_attempts=2, export_timeout=5.0)
    with pytest.raises(InvalidArgumentError, match="start_attempts must be >= 1, got 0"):
        OpenAIProxyClient("http://127.0.0.1:9", ADMIN_KEY, "x", start_attempts=0)
    assert isinstance(InvalidArgumentError("x"), ValueError)  # callers' `except ValueError` still holds


def test_bad_rewards_and_second_export_are_errors(proxy):
    async def episode():
        async with httpx.AsyncClient() as http:
            client = OpenAIProxyClient(proxy.url, ADMIN_KEY, "bad", http_client=http)
            await client.grant_capacity()
            async with client:
                with pytest.raises(ProxyRequestError) as empty:
                    await client.set_last_reward(1.0)  # no call yet
                await _chat(proxy.url, client.session_api_key, "hi")
                with pytest.raises(ProxyRequestError) as unknown:
                    await client.set_reward("chatcmpl-nope", 1.0)
            assert len(await client.export_interactions()) == 1
            with pytest.raises(ProxyRequestError) as again:
                await client.export_interactions()
            assert not http.is_closed  # a shared client is not closed by OpenAIProxyClient
            return empty.value, unknown.value, again.value

    empty, unknown, again = asyncio.run(episode())
    assert empty.status == 400 and unknown.status == 400 and "chatcmpl-nope" in unknown.detail
    assert again.status == 404


def test_session_properties_before_start_and_bad_arguments():
    client = OpenAIProxyClient("http://127.0.0.1:1", ADMIN_KEY, "x")
    with pytest.raises(ValueError, match="no session"):
        _ = client.session_id
    with pytest.raises(ValueError, match="no session"):
        _ = client.session_api_key
    with pytest.raises(ValueError, match="admin_api_key"):
        OpenAIProxyClient("http://127.0.0.1:1", "", "x")
    with pytest.raises(ValueError, match="task_id"):
        OpenAIProxyClient("http://127.0.0.1:1", ADMIN_KEY, "")

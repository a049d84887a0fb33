"""OpenAI request options on the real model through a real server: what the engine can honour is
served (`logprobs=true` returns exactly the log-probs recorded for training), what changes only
delivery is accepted, and what it cannot honour is a 400 (tests/proxy/hostile.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.proxy.hostile import chat, new_session_key

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def client(local_server):
    with httpx.Client(base_url=local_server.url, timeout=60) as c:
        yield c


def _recorded(local_server, sid: str, iid: str):
    return local_server.app.state.proxy.sessions[sid].cache[iid].model_response


def test_logprobs_true_returns_the_recorded_logprobs_of_the_reply_tokens(local_server, client, tiny_tokenizer):
    import openai

    sid, key = new_session_key(client)
    oai = openai.OpenAI(base_url=f"{local_server.url}/v1", api_key=key, max_retries=0)
    completion = oai.chat.completions.create(
        model="tiny-math", messages=[{"role": "user", "content": "2+3?"}], max_tokens=12, logprobs=True, top_logprobs=0
    )
    recorded = _recorded(local_server, sid, completion.id)
    tokens = recorded.output_tokens  # every sampled token, the end token too: as many as usage counts
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens == len(tokens)
    assert [c.logprob for c in content] == pytest.approx(recorded.output_logprobs, abs=0)
    assert [c.token for c in content] == [tiny_tokenizer.decode([t]) for t in tokens]
    stop = len(recorded.output_tokens_without_stop)
    assert "".join(c.token for c in content[:stop]) == completion.choices[0].message.content
    assert all(c.top_logprobs == [] and bytes(c.bytes) == c.token.encode() for c in content)


def test_logprobs_come_with_the_streamed_content(local_server, client):
    sid, key = new_session_key(client)
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                    json=chat("2+3?", max_tokens=12, stream=True, logprobs=True))
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    with_content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(with_content) == 1
    streamed = [lp["logprob"] for lp in with_content[0]["choices"][0]["logprobs"]["content"]]
    recorded = _recorded(local_server, sid, chunks[0]["id"])
    assert streamed == recorded.output_logprobs  # the end token too: as many as usage.completion_tokens


def test_without_logprobs_the_reply_has_none(client):
    _, key = new_session_key(client)
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat())
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("options", [
    {"seed": 7}, {"user": "alice"}, {"parallel_tool_calls": False}, {"response_format": {"type": "text"}}, {"response_format": {"type": "json_object"}},
    {"logit_bias": {}}, {"best_of": 1}, {"modalities": ["text"]}, {"logprobs": False, "top_logprobs": 0},
], ids=lambda o: ",".join(o))
def test_options_that_only_change_delivery_are_served_and_recorded(local_server, client, options):
    sid, key = new_session_key(client)
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat(**options))
    assert r.status_code == 200, r.text
    assert list(local_server.app.state.proxy.sessions[sid].cache) == [r.json()["id"]]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_top_k_is_honoured_top_k_1_samples_the_greedy_reply(local_server, client, path):
    prompt = [{"role": "user", "content": "17+25?"}]
    body = {"model": "tiny-math", "max_tokens": 16, "messages": prompt}
    tokens = []
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "top_k": 1}, {"temperature": 1.0, "top_k": 1}):
        sid, key = new_session_key(client)
        r = client.post(path, headers={"x-api-key": key}, json={**body, **sampling})
        assert r.status_code == 200, r.text
        (interaction,) = local_server.app.state.proxy.sessions[sid].cache.values()
        tokens.append(interaction.model_response.output_tokens)
    assert tokens[1] == tokens[0] and tokens[2] == tokens[0]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("options", [{"max_tokens": 12}, {"max_tokens": 2}, {"max_tokens": 12, "n": 3},
                                     {"max_tokens": 12, "stop": ["+"]}],
                         ids=["ends", "cut-by-length", "n3", "stop-string"])
def test_logprob_entries_and_completion_tokens_agree(client, options, stream):
    """Every door that returns log-probs returns one per token usage counts: the end token is
    counted and covered (as vLLM does), a reply cut by length or a stop string has no end token."""
    _, key = new_session_key(client)
    body = chat("2+3?", logprobs=True, stream=stream, **options)
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        usage = next(c["usage"] for c in chunks if c.get("usage"))
        entries = sum(len((ch.get("logprobs") or {}).get("content") or []) for c in chunks for ch in c["choices"])
    else:
        reply = r.json()
        usage = reply["usage"]
        entries = sum(len(ch["logprobs"]["content"]) for ch in reply["choices"])
    assert entries == usage["completion_tokens"] > 0

"""`/v1/models` and `/v1/models/{id}` report the served context in the fields each client reads,
through the real OpenAI and Anthropic SDKs (tiny-math: 512 tokens)."""

from __future__ import annotations

import anthropic
import openai
import pytest

pytestmark = pytest.mark.server  # a real proxy on loopback (LocalEngine on tiny-math)

CONTEXT_FIELDS = {
    "max_model_len": 512,  # vLLM
    "context_length": 512,
    "context_window": 512,
    "max_context_length": 512,
    "max_input_tokens": 511,  # Anthropic: the most prompt tokens leave one for output
    "max_tokens": 512,
}


def test_the_openai_sdk_reads_the_context_of_the_listed_and_retrieved_model(local_server):
    client = openai.OpenAI(base_url=f"{local_server.url}/v1", api_key="none", max_retries=0)
    (card,) = client.models.list().data
    assert card.id == "tiny-math" and card.object == "model" and card.owned_by == "areal_nb"
    assert {k: card.model_extra[k] for k in CONTEXT_FIELDS} == CONTEXT_FIELDS
    retrieved = client.models.retrieve("tiny-math")
    assert retrieved.id == "tiny-math" and retrieved.model_extra["max_model_len"] == 512
    # a request's `model` names the agent that calls: every name is served, with the same context
    assert client.models.retrieve("solver").model_extra["max_model_len"] == 512


def test_the_anthropic_sdk_reads_max_input_tokens_and_max_tokens(local_server):
    client = anthropic.Anthropic(base_url=local_server.url, api_key="none", max_retries=0)
    (info,) = client.models.list().data
    assert (info.id, info.type, info.display_name) == ("tiny-math", "model", "tiny-math")
    assert (info.max_input_tokens, info.max_tokens) == (511, 512)
    assert client.models.retrieve("tiny-math").max_input_tokens == 511


def test_an_unknown_context_is_left_out(make_app):
    from fastapi.testclient import TestClient

    with TestClient(make_app()) as client:  # a ScriptedEngine reports no context
        card = client.get("/v1/models").json()["data"][0]
        assert not set(CONTEXT_FIELDS) & set(card)
        assert client.get("/v1/models/areal-nb").json() == card

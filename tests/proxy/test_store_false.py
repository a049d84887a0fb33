"""`store: false` is honoured on every door that records: chat completions, Responses and
Anthropic Messages answer such a call as usual and leave nothing in the episode's export; the
same calls without it are recorded. Sent by the real SDKs (`extra_body` for Messages, whose API
has no such field: harnesses that impose one sampling on every API put it there)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.proxy.conftest import SCRIPTED_REPLY, admin_headers, start_session

pytestmark = pytest.mark.server  # a real proxy on loopback (ScriptedEngine)


def _calls(url: str, key: str, store: bool | None) -> None:
    extra = {} if store is None else {"store": store}
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    chat = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=32, **extra
    )
    assert chat.choices[0].message.content == SCRIPTED_REPLY
    response = oai.responses.create(model="m", input="hi", max_output_tokens=32, **extra)
    assert response.output_text == SCRIPTED_REPLY
    streamed = list(oai.responses.create(model="m", input="hi", max_output_tokens=32, stream=True, **extra))
    assert streamed[-1].response.output_text == SCRIPTED_REPLY
    ant = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    message = ant.messages.create(
        model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}], extra_body=extra
    )
    assert message.content[0].text == SCRIPTED_REPLY


def _exported(client: httpx.Client, sid: str, key: str) -> dict:
    assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
    r = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
    assert r.status_code == 200, r.text
    return r.json()["interactions"]


@pytest.mark.filterwarnings("ignore:.*leaf interaction.*no reward set")
def test_store_false_answers_on_every_door_and_records_nothing(scripted_server):
    with httpx.Client(base_url=scripted_server.url) as client:
        sid, key = start_session(client, "unstored")
        _calls(scripted_server.url, key, store=False)
        assert _exported(client, sid, key) == {}
        sid, key = start_session(client, "stored")  # the same calls, stored (default or true)
        _calls(scripted_server.url, key, store=None)
        _calls(scripted_server.url, key, store=True)
        exported = _exported(client, sid, key)
        assert len(exported) == 8


def test_an_unstored_response_cannot_be_continued(scripted_server):
    with httpx.Client(base_url=scripted_server.url) as client:
        _, key = start_session(client, "unstored-previous")
    oai = openai.OpenAI(base_url=f"{scripted_server.url}/v1", api_key=key, max_retries=0)
    first = oai.responses.create(model="m", input="hi", max_output_tokens=32, store=False)
    with pytest.raises(openai.BadRequestError, match="is not a response of this session"):
        oai.responses.create(model="m", input="and?", max_output_tokens=32, previous_response_id=first.id)

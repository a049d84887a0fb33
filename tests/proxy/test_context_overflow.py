"""A conversation longer than the model's context reaches each client in the words its own
overflow check matches: through every door (chat completions, Responses, Anthropic Messages,
text completions and `/tokenize`),
for the token count and for the character bound checked before tokenizing, as the real SDKs
and LangChain raise it. tiny-math: context 512 tokens, longest token 16 characters."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.proxy.conftest import start_session

pytestmark = pytest.mark.server  # a real proxy on loopback (LocalEngine on tiny-math)

CONTEXT = 512
TOKEN_LONG = "1+" * 3_000  # under the character bound (8,176), 6,008 tokens once rendered
CHAR_LONG = "7+" * 5_000  # 10,000 characters: refused before tokenizing
OVERFLOWS = {"tokens": TOKEN_LONG, "characters": CHAR_LONG}


@pytest.fixture
def key(local_server) -> str:
    with httpx.Client(base_url=local_server.url) as admin:
        return start_session(admin)[1]


@pytest.fixture
def oai(local_server, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{local_server.url}/v1", api_key=key, max_retries=0)


def _recorded(local_server, key) -> int:
    return sum(len(s.cache) for s in local_server.app.state.proxy.sessions.values() if s.api_key == key)


@pytest.mark.parametrize("found_by", OVERFLOWS)
def test_chat_completions_overflow_is_openais_context_length_exceeded(local_server, key, oai, found_by):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="tiny-math", messages=[{"role": "user", "content": OVERFLOWS[found_by]}], max_tokens=4
        )
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert error.param == "messages" and error.type == "invalid_request_error"
    expected = "This model's maximum context length is 512 tokens. However, your messages resulted in "
    message = error.body["message"]
    assert message.startswith(expected)
    if found_by == "tokens":
        assert "resulted in 6008 tokens. Please reduce the length of the messages." in message
    else:  # a lower bound: 10,015 characters (keys and role included), at most 16 per token
        assert "resulted in at least 626 tokens. Please reduce the length of the messages." in message
    assert error.response.headers["x-should-retry"] == "false"
    assert _recorded(local_server, key) == 0


@pytest.mark.parametrize("found_by", OVERFLOWS)
def test_responses_overflow_is_context_length_exceeded_on_input(local_server, key, oai, found_by):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="tiny-math", input=OVERFLOWS[found_by], max_output_tokens=4)
    error = caught.value
    assert error.code == "context_length_exceeded" and error.param == "input"
    assert error.body["message"].startswith("Your input exceeds the context window of this model.")
    assert _recorded(local_server, key) == 0


TEXT_PROMPT_TOKENS = {"tokens": 6000, "characters": 625}  # TOKEN_LONG encoded as is; 10,000 characters / 16


@pytest.mark.parametrize("found_by", [*OVERFLOWS, "token ids"])
def test_text_completions_overflow_is_openais_legacy_wording_on_prompt(local_server, key, oai, found_by):
    prompt = [7] * 600 if found_by == "token ids" else OVERFLOWS[found_by]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="tiny-math", prompt=prompt, max_tokens=4)
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert error.param == "prompt" and error.type == "invalid_request_error"
    tokens = 600 if found_by == "token ids" else TEXT_PROMPT_TOKENS[found_by]
    at_least = "at least " if found_by == "characters" else ""
    assert error.body["message"].startswith(
        f"This model's maximum context length is 512 tokens, however you requested {at_least}{tokens + 1} "
        f"tokens ({at_least}{tokens} in your prompt; 1 for the completion). Please reduce your prompt; "
        "or completion length. (the prompt is too long"
    )
    assert error.response.headers["x-should-retry"] == "false"
    assert _recorded(local_server, key) == 0


def test_tokenize_overflow_of_a_prompt_is_worded_as_text_completions(local_server, key):
    with httpx.Client(base_url=local_server.url, headers={"Authorization": f"Bearer {key}"}) as http:
        refused = http.post("/tokenize", json={"prompt": CHAR_LONG})
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": CHAR_LONG}]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["message"].startswith(
        "This model's maximum context length is 512 tokens, however you requested"
    )
    # messages are worded as the chat door words them
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("found_by", OVERFLOWS)
def test_messages_overflow_is_anthropics_prompt_is_too_long(local_server, key, found_by):
    client = anthropic.Anthropic(base_url=local_server.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="tiny-math", max_tokens=4, messages=[{"role": "user", "content": OVERFLOWS[found_by]}]
        )
    error = caught.value
    assert error.status_code == 400 and error.body["error"]["type"] == "invalid_request_error"
    tokens = 6008 if found_by == "tokens" else 626
    assert error.body["error"]["message"].startswith(f"prompt is too long: {tokens} tokens > 511 maximum")
    assert _recorded(local_server, key) == 0


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_langchain_recognises_the_overflow(local_server, key, responses_api):
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="tiny-math",
        base_url=f"{local_server.url}/v1",
        api_key=key,
        max_retries=0,
        max_tokens=4,
        use_responses_api=responses_api,
    )
    with pytest.raises(ContextOverflowError):
        chat.invoke(TOKEN_LONG)
    # a conversation that fits is answered as before
    assert isinstance(chat.invoke("1+1=").content, str | list)


def test_a_request_that_fits_is_not_an_overflow(key, oai):
    reply = oai.chat.completions.create(
        model="tiny-math", messages=[{"role": "user", "content": "1+1="}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None

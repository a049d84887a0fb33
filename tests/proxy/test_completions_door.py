"""`/v1/completions`, OpenAI's legacy text completions as vLLM serves them: the real OpenAI SDK
(`client.completions.create`, streamed too) against a real proxy on loopback.

The recorded row must be exactly what the engine saw and sampled: a string prompt encoded as is
(no chat template), token ids as sent, the sampled tokens' log-probs the SDK returned; each
sample of each prompt is its own interaction, linked into a tree with the text completions it
continues, and rewarded like any other call.
"""

from __future__ import annotations

import warnings

import httpx
import openai
import pytest

from areal_nb.capture import InteractionWithTokenLogpReward, check_retokenization
from areal_nb.capture.completion import CompletionSettings
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import (
    PROXY_ADMIN_KEY,
    SCRIPTED_REPLY,
    admin_headers,
    session_headers,
    start_session,
)

pytestmark = pytest.mark.server

PROMPT = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"


def client_for(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def export(http: httpx.Client, sid: str, key: str, **options) -> dict:
    assert http.post("/rl/end_session", headers=session_headers(key)).status_code == 200
    exported = http.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid, **options})
    assert exported.status_code == 200, exported.text
    return exported.json()["interactions"]


def test_a_text_prompt_is_recorded_as_its_exact_tokens_and_log_probs(local_server, tiny_tokenizer):
    with httpx.Client(base_url=local_server.url) as http:
        sid, key = start_session(http, "text")
        client = client_for(local_server, key)
        completion = client.completions.create(
            model="tiny-math", prompt=PROMPT, max_tokens=12, logprobs=0, temperature=1.0
        )
        chunks = list(
            client.completions.create(
                model="tiny-math", prompt=PROMPT, max_tokens=12, logprobs=0, stream=True
            )
        )
        assert http.post(
            "/rl/set_reward",
            headers=session_headers(key),
            json={"interaction_id": completion.id, "reward": 1.0},
        ).json() == {"message": "success"}
        wire = export(http, sid, key)

    assert completion.object == "text_completion" and len(completion.choices) == 1
    recorded = wire[completion.id]
    response = recorded["model_response"]
    # the prompt's text encoded as it is: no chat template around it, its special tokens as ids
    assert response["input_tokens"] == tiny_tokenizer.encode(PROMPT, add_special_tokens=True)
    assert tiny_tokenizer.decode(response["input_tokens"]) == PROMPT
    assert completion.usage.prompt_tokens == len(response["input_tokens"])
    assert completion.usage.completion_tokens == len(response["output_tokens"])
    choice = completion.choices[0]
    # the SDK got every sampled token's log-prob, exactly the ones recorded for training
    assert choice.logprobs.token_logprobs == response["output_logprobs"]
    assert choice.logprobs.tokens == [
        tiny_tokenizer.decode([t], skip_special_tokens=False) for t in response["output_tokens"]
    ]
    assert choice.logprobs.top_logprobs == [
        {token: lp} for token, lp in zip(choice.logprobs.tokens, response["output_logprobs"], strict=True)
    ]
    offsets = [0]
    for token in choice.logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert choice.logprobs.text_offset == offsets
    stop_free = [t for t in response["output_tokens"] if t not in response["eos_token_ids"]]
    assert choice.text == tiny_tokenizer.decode(stop_free, skip_special_tokens=False)
    assert choice.finish_reason == ("length" if len(response["output_tokens"]) == 12 else "stop")
    # one training row: prompt then output, trained on the output only, at the engine's version
    row = recorded["tensor_dict"]
    assert row["input_ids"] == response["input_tokens"] + response["output_tokens"]
    assert row["loss_mask"] == [0] * len(response["input_tokens"]) + [1] * len(response["output_tokens"])
    assert row["logprobs"][len(response["input_tokens"]) :] == response["output_logprobs"]
    assert set(row["versions"][len(response["input_tokens"]) :]) == {0}
    assert recorded["reward"] == 1.0 and recorded["agent"] == "tiny-math"
    assert recorded["messages"] == [{"role": "prompt", "content": PROMPT}]
    assert recorded["output_message_list"] == [{"role": "assistant", "content": choice.text}]

    # the stream: the text and its log-probs, then the finish reason with the usage, then [DONE]
    (streamed,) = [iid for iid in wire if iid != completion.id]
    assert {c.id for c in chunks} == {streamed}
    assert "".join(c.choices[0].text for c in chunks) == wire[streamed]["output_message_list"][0]["content"]
    assert [c.choices[0].finish_reason is not None for c in chunks] == [False, True]
    assert chunks[0].choices[0].logprobs.token_logprobs == wire[streamed]["model_response"]["output_logprobs"]
    assert chunks[-1].usage.completion_tokens == len(wire[streamed]["model_response"]["output_tokens"])


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    engine = ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with ProxyServer(app) as server:
        yield server, engine


def test_token_ids_echo_n_and_a_batch_of_prompts(scripted, tiny_tokenizer):
    server, engine = scripted
    ids = tiny_tokenizer.encode("2 + 2 =", add_special_tokens=False)
    reply_ids = tiny_tokenizer.encode(SCRIPTED_REPLY, add_special_tokens=False)
    with httpx.Client(base_url=server.url) as http:
        sid, key = start_session(http, "batch")
        client = client_for(server, key)
        echoed = client.completions.create(model="m", prompt=ids, max_tokens=32, echo=True, logprobs=0)
        batch = client.completions.create(model="m", prompt=[ids, "3 + 3 ="], max_tokens=32, n=2)
        wire = export(http, sid, key)

    # token ids go to the engine as sent; echo puts their text before the reply
    assert wire[echoed.id]["model_response"]["input_tokens"] == ids
    choice = echoed.choices[0]
    assert choice.text == "2 + 2 =" + SCRIPTED_REPLY
    # echoed prompt tokens have no log-prob (the engine scores no prompt), the reply's are recorded
    assert choice.logprobs.token_logprobs == [None] * len(ids) + [-0.5] * (len(reply_ids) + 1)
    assert choice.logprobs.top_logprobs[: len(ids)] == [None] * len(ids)
    assert choice.logprobs.text_offset[len(ids)] == len("2 + 2 =")
    assert choice.finish_reason == "stop"

    # two prompts × n=2: choice i is prompt i // 2, interaction `id` or `id-i`, one row each
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [SCRIPTED_REPLY] * 4
    choice_ids = [batch.id] + [f"{batch.id}-{i}" for i in (1, 2, 3)]
    prompts = [wire[i]["model_response"]["input_tokens"] for i in choice_ids]
    assert prompts == [ids, ids] + [tiny_tokenizer.encode("3 + 3 =", add_special_tokens=True)] * 2
    assert batch.usage.prompt_tokens == len(prompts[0]) + len(prompts[2])
    assert batch.usage.completion_tokens == 4 * (len(reply_ids) + 1)
    assert len(wire) == 5 and all(wire[i]["parent_id"] is None for i in choice_ids)


def test_a_text_conversation_is_a_tree_that_chat_calls_stay_out_of(scripted):
    server, _ = scripted
    with httpx.Client(base_url=server.url) as http:
        sid, key = start_session(http, "tree")
        client = client_for(server, key)
        first = client.completions.create(model="m", prompt="Q: 2 + 2?\nA:", max_tokens=32)
        # the agent appends the reply and a new question: a child of the first call
        follow_up = "Q: 2 + 2?\nA:" + first.choices[0].text + "\nQ: sure?\nA:"
        second = client.completions.create(model="m", prompt=follow_up, max_tokens=32)
        other = client.completions.create(model="m", prompt="Q: 3 + 3?\nA:", max_tokens=32)
        # a chat call is never a text completion's parent, even where its text would continue
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Q: 4 + 4?\nA:"}], max_tokens=32
        )
        after_chat = client.completions.create(
            model="m", prompt="Q: 4 + 4?\nA:" + SCRIPTED_REPLY + "\nQ: sure?\nA:", max_tokens=32
        )
        # nor is a completion of another agent (`model`)
        elsewhere = client.completions.create(model="other", prompt=follow_up + " x", max_tokens=32)
        for iid, reward in ((second.id, 1.0), (other.id, 0.5)):
            http.post(
                "/rl/set_reward", headers=session_headers(key), json={"interaction_id": iid, "reward": reward}
            )
        wire = export(http, sid, key, discount=0.5)
    assert wire[second.id]["parent_id"] == first.id
    assert wire[other.id]["parent_id"] is None
    assert wire[after_chat.id]["parent_id"] is None and wire[elsewhere.id]["parent_id"] is None
    assert wire[chat.id]["parent_id"] is None
    # the tree discount carries the child's reward back to the call it continued
    assert wire[first.id]["reward"] == 0.5 * 1.0
    assert wire[second.id]["reward"] == 1.0 and wire[other.id]["reward"] == 0.5


def test_concat_mode_links_a_continuation_only_when_its_tokens_continue(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    # the reply spelled one character per token: its re-encoded text gives other tokens
    reply = [t for c in "The answer is 4" for t in tiny_tokenizer.encode(c, add_special_tokens=False)]
    engine = ScriptedEngine(tiny_tokenizer, reply + [tiny_tokenizer.eos_token_id])
    settings = ProxySettings(
        admin_api_key=PROXY_ADMIN_KEY, completion=CompletionSettings(chat_template_type="concat")
    )
    prompt = tiny_tokenizer.encode("Q: 2 + 2?\nA:", add_special_tokens=True)
    more = tiny_tokenizer.encode("\nQ: sure?\nA:", add_special_tokens=False)
    with (
        ProxyServer(create_app(engine, tiny_tokenizer, settings)) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        sid, key = start_session(http, "concat")
        client = client_for(server, key)
        first = client.completions.create(model="m", prompt=prompt, max_tokens=32)
        with pytest.warns(UserWarning, match="send the prompt as token ids"):
            # the proxy runs in this process: its warning reaches pytest
            as_text = client.completions.create(
                model="m",
                prompt=tiny_tokenizer.decode(prompt) + first.choices[0].text + "\nQ: sure?\nA:",
                max_tokens=32,
            )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            as_ids = client.completions.create(model="m", prompt=prompt + reply + more, max_tokens=32)
        wire = export(http, sid, key, style="concat")
    # concat export: the leaves; the id continuation is one row holding both calls' outputs
    assert set(wire) == {as_text.id, as_ids.id}
    assert wire[as_ids.id]["parent_id"] == first.id and wire[as_text.id]["parent_id"] is None
    row = wire[as_ids.id]["tensor_dict"]
    assert row["input_ids"] == prompt + reply + more + reply + [tiny_tokenizer.eos_token_id]
    n = len(prompt)
    assert row["loss_mask"] == [0] * n + [1] * len(reply) + [0] * len(more) + [1] * (len(reply) + 1)
    # rebuilt from the wire, each is a text completion again; the drift check re-encodes its text
    # (no template): the text prompt is its own encoding, the id prompt holds the reply's
    # one-character tokens, which re-encoding its text merges
    rebuilt = {iid: InteractionWithTokenLogpReward.from_wire(data) for iid, data in wire.items()}
    assert all(it.is_text_completion for it in rebuilt.values())
    assert check_retokenization(rebuilt[as_text.id], tiny_tokenizer).matches
    drift = check_retokenization(rebuilt[as_ids.id], tiny_tokenizer)
    assert not drift.matches and drift.first_difference == n


def test_store_false_and_the_refusals(scripted, tiny_tokenizer):
    server, _ = scripted
    with httpx.Client(base_url=server.url) as http:
        sid, key = start_session(http, "refusals")
        headers = session_headers(key)
        unstored = http.post("/v1/completions", headers=headers, json={"prompt": "hi", "store": False})
        assert unstored.status_code == 200 and unstored.json()["choices"][0]["text"] == SCRIPTED_REPLY
        refusals = {
            "top-k log-probs": ({"logprobs": 1}, 400, "only the sampled tokens' log-probs are known"),
            "negative log-probs": ({"logprobs": -1}, 422, "logprobs"),
            "suffix": ({"suffix": "!"}, 400, "suffix is not supported"),
            "best_of": ({"best_of": 2}, 400, "best_of=2 is not supported"),
            "logit_bias": ({"logit_bias": {"1": 5}}, 400, "logit_bias is not supported"),
            "empty prompt": ({"prompt": ""}, 400, "prompt is empty"),
            "empty list": ({"prompt": []}, 400, "prompt must be a string"),
            "unknown id": ({"prompt": [len(tiny_tokenizer)]}, 400, "is not a token id of this model"),
            "bool id": ({"prompt": [[1, True]]}, 400, "prompt[0][1] must be an integer token id"),
            "mixed": ({"prompt": ["a", 3]}, 400, "prompt[1] must be a string or a list of token ids"),
            "too many": ({"prompt": ["a"] * 5, "n": 16}, 400, "80 generations, more than 64"),
            "n": ({"n": 17}, 400, "n=17 is more than 16 choices"),
            "temperature": ({"temperature": 0.001}, 400, "temperature must be 0 (greedy)"),
            "echo type": ({"echo": "yes"}, 422, "echo"),
        }
        for name, (body, status, message) in refusals.items():
            refused = http.post("/v1/completions", headers=headers, json={"prompt": "hi", **body})
            assert refused.status_code == status, (name, refused.text)
            assert message in refused.json()["error"]["message"], (name, refused.text)
        for bad in ({}, admin_headers(), session_headers("not-a-session-key")):
            assert http.post("/v1/completions", headers=bad, json={"prompt": "a"}).status_code == 401
        assert export(http, sid, key) == {}  # store=false and every refusal recorded nothing
        ended = http.post("/v1/completions", headers=headers, json={"prompt": "a"})
        assert ended.status_code in (409, 410), ended.text  # ended, then exported: the key is gone


def test_a_tokenizer_with_a_bos_token_puts_it_before_text_prompts_only(make_app, tiny_tokenizer):
    """vLLM's `add_special_tokens`: a text prompt (completions, `/tokenize` of a prompt) is encoded
    with the tokenizer's special tokens, a chat prompt gets only what its template writes, and
    token ids are sent as they are."""
    import copy

    from fastapi.testclient import TestClient
    from tokenizers.processors import TemplateProcessing

    from areal_nb.proxy import ProxySettings, create_app

    tokenizer = copy.deepcopy(tiny_tokenizer)
    bos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    body = tokenizer.encode("2 + 2 =", add_special_tokens=False)
    assert tokenizer.encode("2 + 2 =", add_special_tokens=True) == [bos, *body]
    engine = ScriptedEngine(tokenizer, SCRIPTED_REPLY)
    app = create_app(engine, tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with TestClient(app) as http:
        _, key = start_session(http, "bos")
        headers = session_headers(key)
        for prompt in ("2 + 2 =", body):
            assert http.post("/v1/completions", headers=headers, json={"prompt": prompt}).status_code == 200
        chat = {"messages": [{"role": "user", "content": "2 + 2 ="}]}
        assert http.post("/v1/chat/completions", headers=headers, json=chat).status_code == 200
        tokenized = http.post("/tokenize", headers=headers, json={"prompt": "2 + 2 ="}).json()["tokens"]
        plain = http.post(
            "/tokenize", headers=headers, json={"prompt": "2 + 2 =", "add_special_tokens": False}
        ).json()["tokens"]
    text_prompt, ids_prompt, chat_prompt = (list(r.input_ids) for r in engine.requests)
    assert text_prompt == tokenized == [bos, *body] and plain == body
    assert ids_prompt == body  # ids are never touched
    assert chat_prompt[0] != bos and chat_prompt.count(bos) == 0


def test_a_stop_string_ends_the_text_and_stays_in_the_tokens(make_app, tiny_tokenizer):
    """A reply a stop string ended: the text stops before it (`stop_reason` names it, as vLLM
    reports it), the recorded tokens keep it (the model sampled them)."""
    from fastapi.testclient import TestClient

    sampled = tiny_tokenizer.encode("The answer is 4. Then more", add_special_tokens=False)
    engine = ScriptedEngine(tiny_tokenizer, sampled)  # ids without an end token: a stop string ended it
    with TestClient(make_app(engine)) as http:
        sid, key = start_session(http, "stop")
        answer = http.post(
            "/v1/completions", headers=session_headers(key), json={"prompt": "Q:", "stop": [".", "!"]}
        )
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        cache = http.app.state.proxy.sessions[sid].cache
    assert (
        choice["text"] == "The answer is 4"
        and choice["stop_reason"] == "."
        and choice["finish_reason"] == "stop"
    )
    assert cache[answer.json()["id"]].model_response.output_tokens == sampled

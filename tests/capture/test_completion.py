"""`create_chat_completion` / `ArealOpenAI`: request validation, budgets, caching, streaming,
failures, Responses. Engine: ScriptedEngine with the real tiny-math tokenizer."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from areal_nb.capture import (
    ArealOpenAI,
    ChunkStream,
    CompletionRequestError,
    CompletionSettings,
    InteractionCache,
    create_chat_completion,
    resolve_token_budget,
)
from areal_nb.testing import ScriptedEngine

Q = [{"role": "user", "content": "What is 2+3?"}]
TOOLS = [
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}
]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def client(tiny_tokenizer):
    return ArealOpenAI(ScriptedEngine(tiny_tokenizer, "The answer is 5."), tiny_tokenizer)


def create(client, **kw):
    kw.setdefault("messages", Q)
    kw.setdefault("max_completion_tokens", 100)
    return run(client.chat.completions.create(**kw))


# ----- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"messages": tuple(Q)}, TypeError, "messages must be a list"),
        ({"messages": "hello"}, TypeError, "messages must be a list"),
        ({"messages": [Q[0], "raw string"]}, TypeError, r"messages\[1\] must be a dict"),
        ({"messages": []}, CompletionRequestError, "messages cannot be empty"),
        ({"n": 0}, CompletionRequestError, "n must be positive"),
        ({"n": 17}, CompletionRequestError, r"n=17 is more than 16 choices"),
        ({"n": 2.0}, CompletionRequestError, "n must be an integer"),
        (
            {"max_tokens": 5, "max_completion_tokens": 5},
            CompletionRequestError,
            "cannot be set at the same time",
        ),
        ({"max_completion_tokens": 0}, CompletionRequestError, "max_completion_tokens must be positive"),
        ({"max_completion_tokens": True}, CompletionRequestError, "max_completion_tokens must be an integer"),
        (
            {"max_total_tokens": 5},
            CompletionRequestError,
            r"len of prompt tokens \d+ exceeds max_total_tokens 5",
        ),
        (
            {"temperature": -1.0},
            CompletionRequestError,
            r"temperature must be 0 \(greedy\) or in \[0.01, 100\]",
        ),
        ({"stop": 3}, CompletionRequestError, "stop must be a string or a list"),
        ({"tools": {"a": 1}}, CompletionRequestError, "tools must be a list"),
        (
            {"extra_body": {"chat_template_kwargs": 1}},
            CompletionRequestError,
            "chat_template_kwargs must be a dict",
        ),
    ],
)
def test_invalid_requests_raise_and_cache_nothing(client, kwargs, error, match):
    with pytest.raises(error, match=match):
        create(client, **kwargs)
    assert len(client.cache) == 0 and client.engine.requests == []


def test_type_errors_are_also_request_errors(client):
    with pytest.raises(CompletionRequestError):
        create(client, messages=tuple(Q))


def test_prompt_longer_than_engine_max_tokens(tiny_tokenizer):
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "x"), tiny_tokenizer, engine_max_tokens=10)
    with pytest.raises(CompletionRequestError, match="exceeds engine_max_tokens 10"):
        create(c)
    assert len(c.cache) == 0


# ----- budget -----------------------------------------------------------------------------------
def test_token_budget_rules():
    assert resolve_token_budget(10, max_completion_tokens=5).max_new_tokens == 5
    assert resolve_token_budget(10, max_tokens=7).max_new_tokens == 7
    b = resolve_token_budget(10, max_total_tokens=30, max_completion_tokens=50, engine_max_tokens=100)
    assert (b.max_new_tokens, b.max_total_tokens) == (20, 30)
    b = resolve_token_budget(10, max_total_tokens=100, max_completion_tokens=5, engine_max_tokens=40)
    assert (b.max_new_tokens, b.max_total_tokens) == (5, 40)
    with pytest.warns(UserWarning, match="at most 512"):
        assert resolve_token_budget(10).max_new_tokens == 512
    with pytest.raises(CompletionRequestError, match="len of prompt tokens 40 exceeds engine_max_tokens 40"):
        resolve_token_budget(40, engine_max_tokens=40, max_total_tokens=41)


def test_engine_gets_the_budget_and_sampling(client):
    create(client, max_completion_tokens=None, max_tokens=9, temperature=0, top_p=None, stop="###")
    g = client.engine.requests[-1].gconfig
    assert (g.max_new_tokens, g.greedy, g.temperature, g.top_p, g.stop) == (9, True, 0.0, 1.0, ["###"])
    assert set(g.stop_token_ids) == {client.tokenizer.eos_token_id, client.tokenizer.pad_token_id}
    assert g.max_tokens == len(client.engine.requests[-1].input_ids) + 9


def test_sdk_not_given_placeholders_mean_unset(client):
    completion = create(client, temperature=openai.NOT_GIVEN, top_p=openai.omit)
    assert completion.choices[0].message.content == "The answer is 5."
    assert client.engine.requests[-1].gconfig.temperature == 1.0


# ----- results and caching ----------------------------------------------------------------------
def test_completion_object_and_cached_interaction(client, tiny_tokenizer):
    completion = create(client, metadata={"task": "t1"})
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.choices[0].finish_reason == "stop"
    it = client.get_interaction(completion.id)
    mr = it.model_response
    assert (
        completion.usage.prompt_tokens == mr.input_len and completion.usage.completion_tokens == mr.output_len
    )
    assert mr.output_tokens == tiny_tokenizer.encode("The answer is 5.", add_special_tokens=False) + [
        tiny_tokenizer.eos_token_id
    ]
    assert it.output_message_list == [{"role": "assistant", "content": "The answer is 5."}]
    assert it.messages == Q and it.is_complete and it.chat_template_type == "hf"
    assert client.engine.requests[-1].metadata == {"task": "t1"}


def test_store_false_records_nothing(client):
    create(client, store=False)
    assert len(client.cache) == 0


def test_length_truncated_output(client):
    completion = create(client, max_completion_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 3


def test_failed_generation_removes_its_entry(tiny_tokenizer):
    replies = iter(["first", RuntimeError("engine crashed")])

    def script(req):
        r = next(replies)
        if isinstance(r, Exception):
            raise r
        return r

    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, script), tiny_tokenizer)
    first = create(c)
    with pytest.raises(RuntimeError, match="engine crashed"):
        create(c, messages=[{"role": "user", "content": "other"}])
    assert list(c.cache) == [first.id]
    assert c.set_last_reward(1) == first.id


def test_hf_mode_children_get_parents_and_tree_discount(client):
    msgs = list(Q)
    ids = []
    for _ in range(3):
        completion = create(client, messages=msgs)
        ids.append(completion.id)
        msgs += [completion.choices[0].message, {"role": "user", "content": "Sure?"}]
    client.set_reward(ids[2], 2)
    client.apply_reward_discount(0.9)
    out = client.export_interactions("individual")
    assert [out[i].reward for i in ids] == pytest.approx([1.62, 1.8, 2.0])
    assert out[ids[2]].parent is out[ids[1]]
    with pytest.raises(ValueError, match="Cannot export interactions in 'concat' style"):
        client.export_interactions("concat")


def test_tools_with_tool_choice_none_are_not_parsed(tiny_tokenizer):
    text = '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>'
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, text), tiny_tokenizer)
    assert create(c, tools=TOOLS, tool_choice="none").choices[0].message.content == text
    parsed = create(c, tools=TOOLS)
    assert parsed.choices[0].finish_reason == "tool_calls" and parsed.choices[0].message.content == ""
    assert create(c).choices[0].message.tool_calls is None  # no tools given: no parsing


def test_function_is_usable_without_a_client(tiny_tokenizer):
    cache = InteractionCache()
    settings = CompletionSettings(chat_template_type="concat")
    completion = run(
        create_chat_completion(
            engine=ScriptedEngine(tiny_tokenizer, "ok"),
            tokenizer=tiny_tokenizer,
            settings=settings,
            cache=cache,
            messages=Q,
            max_completion_tokens=10,
            model="ignored",
        )
    )
    assert cache[completion.id].chat_template_type == "concat"
    with pytest.raises(ValueError, match="chat_template_type"):
        CompletionSettings(chat_template_type="chatml")


def test_settings_supply_sampling_a_request_leaves_out(tiny_tokenizer):
    """A server's defaults (the Session's rollout.temperature/top_p/max_new_tokens) fill the gaps;
    what the request says wins; no default chosen keeps the 512-token budget with a warning."""
    engine = ScriptedEngine(tiny_tokenizer, "x " * 40)
    settings = CompletionSettings(
        default_temperature=0.7, default_top_p=0.9, default_max_new_tokens=16, engine_max_tokens=1000
    )  # a context limit does not replace the default

    def generate(**kw):
        run(
            create_chat_completion(
                engine=engine, tokenizer=tiny_tokenizer, settings=settings, cache=None, messages=Q, **kw
            )
        )
        return engine.requests[-1].gconfig

    g = generate()
    assert (g.temperature, g.top_p, g.max_new_tokens, g.greedy) == (0.7, 0.9, 16, False)
    g = generate(temperature=0.0, top_p=0.5, max_completion_tokens=3)
    assert (g.temperature, g.top_p, g.max_new_tokens, g.greedy) == (0.0, 0.5, 3, True)
    settings = CompletionSettings()
    with pytest.warns(UserWarning, match="generating at most 512"):
        g = generate()
    assert (g.temperature, g.top_p, g.max_new_tokens) == (1.0, 1.0, 512)
    with pytest.raises(ValueError, match="default_top_p"):
        CompletionSettings(default_top_p=0.0)


# ----- streaming --------------------------------------------------------------------------------
def test_stream_chunks(tiny_tokenizer):
    text = 'Calling.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>'
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, text), tiny_tokenizer)

    async def consume():
        stream = await c.chat.completions.create(
            messages=Q, tools=TOOLS, stream=True, max_completion_tokens=200
        )
        assert isinstance(stream, ChunkStream)
        assert len(c.cache) == 1 and next(iter(c.cache.values())).is_complete  # recorded before streaming
        async with stream as s:
            return [chunk async for chunk in s]

    chunks = run(consume())
    assert len({ch.id for ch in chunks}) == 1 and all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[1].choices[0].delta.content == "Calling."
    call = chunks[2].choices[0].delta.tool_calls[0]
    assert (call.index, call.type, call.function.name, call.function.arguments) == (
        0,
        "function",
        "calc",
        '{"x": 1}',
    )
    assert [ch.choices[0].finish_reason for ch in chunks] == [None, None, None, "tool_calls"]
    usage = chunks[-1].usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and usage.completion_tokens > 0


def test_stop_string_is_left_out_of_the_text_but_kept_in_the_tokens(tiny_tokenizer):
    """As in the OpenAI API, the returned text ends before the stop string that ended the
    generation (the matched string is `choice.stop_reason`, as vLLM reports it); the recorded
    tokens keep it, since the model generated them and they are trained on."""
    ids = tiny_tokenizer.encode("The answer is 5. Done", add_special_tokens=False)
    cut = next(i for i in range(1, len(ids) + 1) if tiny_tokenizer.decode(ids[:i]).endswith("5."))
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, ids[:cut]), tiny_tokenizer)  # no EOS: a stop-string stop
    completion = create(c, stop=["zzz", "."])
    choice = completion.choices[0]
    assert (choice.message.content, choice.finish_reason, choice.stop_reason) == (
        "The answer is 5",
        "stop",
        ".",
    )
    it = c.get_interaction(completion.id)
    assert it.model_response.output_tokens == ids[:cut]
    assert it.output_message_list == [{"role": "assistant", "content": "The answer is 5"}]
    assert it.to_tensor_dict()["loss_mask"][0].tolist()[-cut:] == [1] * cut
    # a reply that ended on EOS is not cut, even if it contains a stop string
    plain = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "The answer is 5."), tiny_tokenizer)
    done = create(plain, stop=["."]).choices[0]
    assert done.message.content == "The answer is 5." and getattr(done, "stop_reason", None) is None
    r = run(c.responses.create(input="What is 2+3?", max_output_tokens=20, stop=["."]))
    assert r.output_text == "The answer is 5"


def test_a_stop_string_that_closes_a_tool_call_still_gives_the_call(tiny_tokenizer):
    """stop=["</tool_call>"] ends the reply on the call's closing tag: the text loses the tag,
    the call is still parsed from what the model wrote."""
    ids = tiny_tokenizer.encode(
        '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', add_special_tokens=False
    )
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, ids), tiny_tokenizer)  # no EOS: a stop-string stop
    choice = create(c, tools=TOOLS, stop=["</tool_call>"]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.stop_reason == "</tool_call>"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("calc", {"x": 1})


# ----- n > 1 ------------------------------------------------------------------------------------
def _numbered_replies(tokenizer):
    count = iter(range(100))
    return ScriptedEngine(tokenizer, lambda req: f"Answer {next(count)}.")


def test_n_choices_are_one_interaction_each_with_exact_rows(tiny_tokenizer):
    """n > 1 samples the prompt n times; each choice is its own interaction (`completion.id` is
    choice 0's, `f"{completion.id}-{i}"` choice i's), with its own tokens, and a next call that
    echoes choice i's message is choice i's child."""
    engine = _numbered_replies(tiny_tokenizer)
    c = ArealOpenAI(engine, tiny_tokenizer, chat_template_type="concat")
    completion = create(c, n=3, logprobs=True)
    cid = completion.id
    assert [ch.index for ch in completion.choices] == [0, 1, 2]
    assert sorted(ch.message.content for ch in completion.choices) == ["Answer 0.", "Answer 1.", "Answer 2."]
    ids = [cid, f"{cid}-1", f"{cid}-2"]
    assert list(c.cache) == ids
    assert (
        c.cache.last_interaction_id == cid
    )  # a reward without an id goes to choice 0, the one agents continue
    assert len(engine.requests) == 3 and all(
        r.input_ids == engine.requests[0].input_ids for r in engine.requests
    )
    for i, iid in enumerate(ids):
        it = c.get_interaction(iid)
        assert it.interaction_id == iid and it.parent is None and it.is_complete
        assert it.output_message_list == [completion.choices[i].message.model_dump(exclude_none=True)]
        mr = it.model_response
        assert tiny_tokenizer.decode(mr.output_tokens) == completion.choices[i].message.content + "<|im_end|>"
        own = completion.choices[i].logprobs.content  # each choice carries its own sample's log-probs
        assert "".join(t.token for t in own) == completion.choices[i].message.content + "<|im_end|>"
        assert [t.logprob for t in own] == mr.output_logprobs and len(own) == mr.output_len  # end token too
        row = it.to_tensor_dict()
        assert row["input_ids"][0].tolist() == mr.input_tokens + mr.output_tokens
        assert row["loss_mask"][0].tolist() == [0] * mr.input_len + [1] * mr.output_len
    prompt_len = c.get_interaction(cid).model_response.input_len
    outputs = [c.get_interaction(i).model_response.output_len for i in ids]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt_len, sum(outputs))
    # continue from choice 1 only: it gets the child; choices 0 and 2 stay leaves
    follow = create(c, messages=[*Q, completion.choices[1].message, {"role": "user", "content": "Sure?"}])
    child = c.get_interaction(follow.id)
    assert child.parent is c.get_interaction(ids[1])
    c.set_reward(ids[0], 1.0)
    c.set_reward(ids[2], 0.0)
    c.set_reward(follow.id, 1.0)
    leaves = c.export_interactions("concat", reward_discount=0.5)
    assert list(leaves) == [ids[0], ids[2], follow.id]
    assert c.get_interaction(ids[1]).reward == 0.5  # its own 0 + 0.5 x its child's 1


def test_n_choices_stream_by_index_and_a_failed_sample_records_nothing(tiny_tokenizer):
    c = ArealOpenAI(_numbered_replies(tiny_tokenizer), tiny_tokenizer)

    async def consume():
        stream = await c.chat.completions.create(messages=Q, n=2, stream=True, max_completion_tokens=20)
        return [chunk async for chunk in stream]

    chunks = run(consume())
    by_index = {0: "", 1: ""}
    for ch in chunks:
        for choice in ch.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert sorted(by_index.values()) == ["Answer 0.", "Answer 1."]
    assert [
        (ch.choices[0].index, ch.choices[0].finish_reason) for ch in chunks if ch.choices[0].finish_reason
    ] == [(0, "stop"), (1, "stop")]
    assert [ch.usage is not None for ch in chunks] == [False] * (len(chunks) - 1) + [True]
    assert len(c.cache) == 2

    class FailsSecond(ScriptedEngine):
        async def agenerate(self, req):
            if len(self.requests) == 1:
                self.requests.append(req)
                raise RuntimeError("engine lost a row")
            return await super().agenerate(req)

    failing = ArealOpenAI(FailsSecond(tiny_tokenizer, "x"), tiny_tokenizer)
    with pytest.raises(RuntimeError, match="engine lost a row"):
        create(failing, n=3)
    assert len(failing.cache) == 0


# ----- responses --------------------------------------------------------------------------------
def test_responses_create_links_turns_and_parses_tools(tiny_tokenizer):
    replies = iter(['<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>', "It is 5."])
    c = ArealOpenAI(
        ScriptedEngine(tiny_tokenizer, lambda req: next(replies)), tiny_tokenizer, chat_template_type="concat"
    )
    tools = [{"type": "function", "name": "calc", "parameters": {"type": "object", "properties": {}}}]
    r1 = run(
        c.responses.create(input="What is 2+3?", instructions="Be brief.", tools=tools, max_output_tokens=200)
    )
    assert r1.id.startswith("resp-") and [o.type for o in r1.output] == ["function_call"]
    assert (r1.output[0].name, r1.output[0].arguments) == ("calc", '{"expr": "2+3"}')
    first = c.get_interaction(r1.id)
    assert first.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    follow = [
        {"role": "user", "content": "What is 2+3?"},
        *r1.output,
        {"type": "function_call_output", "call_id": r1.output[0].call_id, "output": "5"},
    ]
    r2 = run(c.responses.create(input=follow, instructions="Be brief.", tools=tools, max_output_tokens=200))
    assert r2.output[0].content[0].text == "It is 5."
    second = c.get_interaction(r2.id)
    assert second.parent is first
    assert second.messages[-1] == {"role": "tool", "content": "5", "tool_call_id": r1.output[0].call_id}
    assert r2.usage.input_tokens == second.model_response.input_len
    assert list(c.export_interactions("concat")) == [r2.id]
    with pytest.raises(CompletionRequestError, match="input is required"):
        run(c.responses.create(max_output_tokens=5))
    with pytest.raises(CompletionRequestError, match="unsupported type 'input_image'"):
        run(
            c.responses.create(
                input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
            )
        )


def test_previous_response_id_continues_the_stored_conversation(tiny_tokenizer):
    """`previous_response_id` + only the new items: the prompt holds the whole conversation (the
    earlier input, the earlier output, the new item), the call is the earlier one's child, and
    the earlier call's instructions are not carried over (OpenAI's rule): this call's are used."""
    replies = iter(
        ['<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>', "It is 5.", "Yes."]
    )
    c = ArealOpenAI(
        ScriptedEngine(tiny_tokenizer, lambda req: next(replies)), tiny_tokenizer, chat_template_type="concat"
    )
    tools = [{"type": "function", "name": "calc", "parameters": {"type": "object", "properties": {}}}]
    r1 = run(
        c.responses.create(input="What is 2+3?", instructions="Be brief.", tools=tools, max_output_tokens=200)
    )
    call_id = r1.output[0].call_id
    r2 = run(
        c.responses.create(
            previous_response_id=r1.id,
            instructions="Be brief.",
            tools=tools,
            max_output_tokens=200,
            input=[{"type": "function_call_output", "call_id": call_id, "output": "5"}],
        )
    )
    first, second = c.get_interaction(r1.id), c.get_interaction(r2.id)
    assert r2.previous_response_id == r1.id and r2.output[0].content[0].text == "It is 5."
    assert second.parent is first
    assert second.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"expr": "2+3"}'},
                }
            ],
        },
        {"role": "tool", "content": "5", "tool_call_id": call_id},
    ]
    # exact tokens: the first call's prompt and output, then the tool result, then the generation prompt
    suffix = tiny_tokenizer.encode(
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    mr1 = first.model_response
    assert second.model_response.input_tokens == mr1.input_tokens + mr1.output_tokens + suffix
    # a third turn without instructions: the chain's history, no system message
    r3 = run(c.responses.create(previous_response_id=r2.id, input="Sure?", max_output_tokens=20))
    third = c.get_interaction(r3.id)
    assert third.messages == second.messages[1:] + [
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "Sure?"},
    ]
    assert third.parent is None  # another prompt (no system message): a new root
    assert tiny_tokenizer.decode(third.model_response.input_tokens).startswith(
        "<|im_start|>user\nWhat is 2+3?"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"previous_response_id": "resp-nope"},
            "previous_response_id 'resp-nope' is not a response of this session",
        ),
        ({"previous_response_id": 7}, "previous_response_id must be a string"),
        ({"conversation": "conv_1"}, "conversation is not supported"),
    ],
)
def test_previous_response_id_errors_record_nothing(client, kwargs, match):
    with pytest.raises(CompletionRequestError, match=match):
        run(client.responses.create(input="hi", max_output_tokens=5, **kwargs))
    chat = create(client)  # a chat completion's id is not a response id
    with pytest.raises(CompletionRequestError, match="is not a response of this session"):
        run(client.responses.create(input="hi", max_output_tokens=5, previous_response_id=chat.id))
    assert list(client.cache) == [chat.id]


def test_responses_stream_events_rebuild_the_response(tiny_tokenizer):
    """`responses.create(stream=True)`: the OpenAI event sequence (created, in_progress, per
    output item added/deltas/done, completed) with increasing sequence numbers; the text deltas
    and argument deltas rebuild the output, `response.completed` carries the recorded response."""
    from areal_nb.capture.response_stream import response_stream_events

    text = 'Let me add.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'
    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, text), tiny_tokenizer)
    tools = [{"type": "function", "name": "calc", "parameters": {"type": "object", "properties": {}}}]

    async def consume():
        stream = await c.responses.create(
            input="What is 2+3?", tools=tools, max_output_tokens=200, stream=True
        )
        async with stream as s:
            return [event async for event in s]

    events = run(consume())
    recorded = next(iter(c.cache.values()))
    assert recorded.is_complete
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[4].delta == "Let me add." and events[4].item_id == events[2].item.id
    assert events[9].delta == '{"expr": "2+3"}' and events[10].arguments == '{"expr": "2+3"}'
    final = events[-1].response
    assert final == recorded.response and final.id == recorded.interaction_id
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert response_stream_events(final) == events


def test_length_truncated_parent_in_concat_mode(tiny_tokenizer):
    c = ArealOpenAI(
        ScriptedEngine(tiny_tokenizer, "The answer is 5."), tiny_tokenizer, chat_template_type="concat"
    )
    first = create(c, max_completion_tokens=3)
    assert first.choices[0].finish_reason == "length"
    msgs = [*Q, first.choices[0].message, {"role": "user", "content": "Go on."}]
    second = create(c, messages=msgs)
    parent, child = c.get_interaction(first.id), c.get_interaction(second.id)
    assert child.parent is parent
    row = child.to_tensor_dict()
    n_in, n_out = parent.model_response.input_len, 3
    eos = tiny_tokenizer.eos_token_id
    suffix = tiny_tokenizer.encode(
        "\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    expected_prompt = (
        parent.model_response.input_tokens + parent.model_response.output_tokens + [eos, *suffix]
    )
    assert child.model_response.input_tokens == expected_prompt
    gap = child.model_response.input_len - n_in - n_out
    assert (
        row["loss_mask"][0].tolist()
        == [0] * n_in + [1] * n_out + [0] * gap + [1] * child.model_response.output_len
    )
    assert row["input_ids"][0, n_in + n_out].item() == eos


def test_clients_share_one_http_client_that_refuses_to_send(tiny_tokenizer):
    # A default SDK client per ArealOpenAI would load the CA bundle every episode; ours never sends.
    first = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "x"), tiny_tokenizer, max_retries=0)
    second = ArealOpenAI(ScriptedEngine(tiny_tokenizer, "y"), tiny_tokenizer)
    assert first._client is second._client
    # openai 3 raises the transport's error as is; openai 2 wraps it in APIConnectionError
    with pytest.raises(Exception) as info:
        asyncio.run(first.models.retrieve("tiny"))
    refusal = info.value if isinstance(info.value, RuntimeError) else info.value.__cause__
    assert isinstance(refusal, RuntimeError) and "sends no HTTP requests" in str(refusal)
    # A caller's own client is kept.
    import httpx

    own = httpx.AsyncClient()
    assert ArealOpenAI(ScriptedEngine(tiny_tokenizer, "z"), tiny_tokenizer, http_client=own)._client is own

"""Chat templates (hf, concat alignment, drift check) and tool-call parsing on `tiny-math`."""

from __future__ import annotations

import asyncio
import json

import pytest

from areal_nb.capture import (
    ArealOpenAI,
    ConcatAlignmentError,
    InteractionWithTokenLogpReward,
    check_retokenization,
    concat_prompt_token_ids_with_parent,
    parse_tool_calls,
    render_prompt_ids,
)
from areal_nb.testing import ScriptedEngine

from .helpers import response

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string"}},
                "required": ["expr"],
            },
        },
    }
]
CALL_1 = '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'
CALL_2 = (
    'Let me check both.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "5*2"}}\n</tool_call>'
    '\n<tool_call>\n{"name": "calc", "arguments": {"expr": "10-1"}}\n</tool_call>'
)
FINAL = "The answer is 10."


def run_tool_conversation(tokenizer, replies, template="concat"):
    """Agent loop: call, run every tool call (result "5"), call again; returns client, engine, messages."""
    engine = ScriptedEngine(tokenizer, lambda req: replies[len(engine.requests) - 1])
    client = ArealOpenAI(engine, tokenizer, chat_template_type=template)
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+3 then times 2?"},
    ]

    async def loop():
        ids = []
        for _ in replies:
            completion = await client.chat.completions.create(
                messages=messages, tools=TOOLS, max_completion_tokens=400
            )
            ids.append(completion.id)
            message = completion.choices[0].message
            messages.append(message)
            for tc in message.tool_calls or []:
                messages.append({"role": "tool", "content": "5", "tool_call_id": tc.id})
            if not message.tool_calls:
                messages.append({"role": "user", "content": "Are you sure?"})
        return ids

    return client, engine, messages, asyncio.run(loop())


def test_hf_render_is_the_tokenizer_template(tiny_tokenizer):
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids = render_prompt_ids(tiny_tokenizer, msgs)
    assert tiny_tokenizer.decode(ids) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"


def test_concat_prompts_equal_hf_render_of_full_conversation_with_tool_calls(tiny_tokenizer):
    client, engine, _, ids = run_tool_conversation(tiny_tokenizer, [CALL_1, CALL_2, FINAL, FINAL])
    calls = [client.get_interaction(i) for i in ids]
    assert [c.completion.choices[0].finish_reason for c in calls] == [
        "tool_calls",
        "tool_calls",
        "stop",
        "stop",
    ]
    assert [c.parent for c in calls] == [None, calls[0], calls[1], calls[2]]
    for c in calls:  # the alignment property
        check = check_retokenization(c, tiny_tokenizer)
        assert check.matches, (check.first_difference, tiny_tokenizer.decode(check.prompt_ids))
        assert c.model_response.input_tokens == render_prompt_ids(tiny_tokenizer, c.messages, TOOLS)
    leaf = client.export_interactions("concat")
    assert list(leaf) == [ids[-1]]
    row = leaf[ids[-1]].to_tensor_dict()
    # the leaf row is exactly what the engine saw and produced, turn by turn
    pos = 0
    for turn, (req, c) in enumerate(zip(engine.requests, calls, strict=True)):
        out = c.model_response.output_tokens
        assert row["input_ids"][0, : len(req.input_ids)].tolist() == req.input_ids
        pos = len(req.input_ids)
        assert row["input_ids"][0, pos : pos + len(out)].tolist() == out
        assert row["turn_ids"][0, pos : pos + len(out)].tolist() == [turn] * len(out)
        assert row["loss_mask"][0, pos : pos + len(out)].tolist() == [1] * len(out)
    assert row["input_ids"].shape[1] == pos + len(calls[-1].model_response.output_tokens)
    assert int(row["loss_mask"].sum()) == sum(c.model_response.output_len for c in calls)
    # tool results are in the gaps, masked
    tool_msg = tiny_tokenizer.encode("<tool_response>", add_special_tokens=False)
    text_ids = row["input_ids"][0].tolist()
    at = next(i for i in range(len(text_ids)) if text_ids[i : i + len(tool_msg)] == tool_msg)
    assert row["loss_mask"][0, at].item() == 0 and row["turn_ids"][0, at].item() == -1


@pytest.mark.parametrize(
    ("first_tools", "second_tools"), [(None, TOOLS), (TOOLS, None)], ids=["tools-added", "tools-dropped"]
)
def test_concat_call_whose_tools_change_is_rendered_whole_as_a_new_root(
    tiny_tokenizer, first_tools, second_tools
):
    """Tools render into the system block, so a call whose tools differ from its parent's does not
    continue the parent's tokens: counting EOS into the new render put the earlier answer twice
    into the prompt (tools added) or dropped the new user message (tools dropped). Such a call
    is rendered whole, as a new root, with a warning; each generated token is still in exactly
    one concat leaf."""
    from areal_nb.capture import ConversationLinkWarning

    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, FINAL), tiny_tokenizer, chat_template_type="concat")
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    first = asyncio.run(c.chat.completions.create(messages=msgs, tools=first_tools, max_completion_tokens=20))
    msgs = [*msgs, first.choices[0].message, {"role": "user", "content": "Check it."}]
    with pytest.warns(ConversationLinkWarning, match="tools or chat_template_kwargs differ"):
        second = asyncio.run(
            c.chat.completions.create(messages=msgs, tools=second_tools, max_completion_tokens=20)
        )
    b = c.get_interaction(second.id)
    assert b.parent is None
    assert b.model_response.input_tokens == render_prompt_ids(tiny_tokenizer, b.messages, second_tools)
    assert check_retokenization(b, tiny_tokenizer).matches
    leaves = c.export_interactions("concat")
    assert list(leaves) == [first.id, second.id]
    row = leaves[second.id].to_tensor_dict()
    n_in = b.model_response.input_len
    assert row["loss_mask"][0].tolist() == [0] * n_in + [1] * b.model_response.output_len
    assert row["turn_ids"][0].tolist() == [-1] * n_in + [0] * b.model_response.output_len


def test_concat_child_with_the_same_tools_and_kwargs_keeps_its_parent(tiny_tokenizer):
    import warnings

    c = ArealOpenAI(ScriptedEngine(tiny_tokenizer, FINAL), tiny_tokenizer, chat_template_type="concat")
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    first = asyncio.run(c.chat.completions.create(messages=msgs, tools=TOOLS, max_completion_tokens=20))
    msgs = [*msgs, first.choices[0].message, {"role": "user", "content": "Check it."}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = asyncio.run(
            c.chat.completions.create(messages=msgs, tools=[dict(TOOLS[0])], max_completion_tokens=20)
        )
    assert c.get_interaction(second.id).parent is c.get_interaction(first.id)


def test_tool_call_message_content_and_arguments(tiny_tokenizer):
    client, _, _, ids = run_tool_conversation(tiny_tokenizer, [CALL_2, FINAL])
    msg = client.get_interaction(ids[0]).completion.choices[0].message
    assert msg.content == "Let me check both."
    assert [(t.function.name, t.function.arguments) for t in msg.tool_calls] == [
        ("calc", '{"expr": "5*2"}'),
        ("calc", '{"expr": "10-1"}'),
    ]
    assert all(t.id.startswith("call_") and len(t.id) == 29 for t in msg.tool_calls)


def test_drift_is_reported_where_the_rerender_differs(tiny_tokenizer):
    # "\n\n" after </think> is dropped from the message, so a re-render differs from the tokens
    thinking = "<think>\nadd\n</think>\n\n" + CALL_1
    client, _, _, ids = run_tool_conversation(tiny_tokenizer, [thinking, FINAL])
    child = client.get_interaction(ids[1])
    check = check_retokenization(child, tiny_tokenizer)
    assert not check.matches
    parent_in = client.get_interaction(ids[0]).model_response.input_len
    assert check.prompt_ids[: check.first_difference] == check.rendered_ids[: check.first_difference]
    assert check.first_difference > parent_in
    assert tiny_tokenizer.decode(check.prompt_ids[parent_in : check.first_difference + 1]).startswith(
        "<think>\nadd\n</think>"
    )
    # in hf mode the prompt is the plain render, so the check matches
    client_hf, _, _, ids_hf = run_tool_conversation(tiny_tokenizer, [thinking, FINAL], template="hf")
    assert check_retokenization(client_hf.get_interaction(ids_hf[1]), tiny_tokenizer).matches


def test_concat_alignment_failure_is_a_clear_error(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    prompt = render_prompt_ids(tiny_tokenizer, [{"role": "user", "content": "q"}])
    out = tiny_tokenizer.encode("a", add_special_tokens=False)
    # the model generated two EOS tokens inside its content: the template has fewer to count
    parent = InteractionWithTokenLogpReward(
        model_response=response(prompt, out + [eos] + out + [eos] + out + [eos]),
        messages=[{"role": "user", "content": "q"}],
        output_message_list=[{"role": "assistant", "content": "a"}],
        chat_template_type="concat",
        _interaction_id="p",
    )
    parent.model_response.eos_token_ids = [eos]
    with pytest.raises(ConcatAlignmentError, match="Failed to align child tokens with parent tokens"):
        concat_prompt_token_ids_with_parent([{"role": "user", "content": "u"}], parent, tiny_tokenizer)
    no_tokens = InteractionWithTokenLogpReward(messages=[], output_message_list=[], _interaction_id="n")
    with pytest.raises(ValueError, match="Parent interaction n has no model_response"):
        concat_prompt_token_ids_with_parent([], no_tokens, tiny_tokenizer)


def test_stop_string_parent_gets_an_eos_in_the_childs_gap(tiny_tokenizer):
    client, _, _, ids = run_tool_conversation(
        tiny_tokenizer, [tiny_tokenizer.encode("The answer is", add_special_tokens=False), FINAL]
    )
    parent, child = client.get_interaction(ids[0]), client.get_interaction(ids[1])
    assert (
        parent.model_response.stop_reason == "stop"
        and parent.model_response.output_tokens[-1] != tiny_tokenizer.eos_token_id
    )
    row = child.to_tensor_dict()
    p_end = parent.model_response.input_len + parent.model_response.output_len
    assert row["input_ids"][0, p_end].item() == tiny_tokenizer.eos_token_id
    assert row["loss_mask"][0, p_end].item() == 0
    assert row["loss_mask"][0, p_end - 1].item() == 1


# ----- tool-call parsing ----------------------------------------------------------------------
def test_parse_skips_calls_inside_thinking():
    text = (
        '<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call></think>\n'
        '<tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "b"}}</tool_call>'
    )
    calls, rest = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("search", '{"q": "a"}'), ("search", '{"q": "b"}')]
    assert rest == '<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call></think>'


def test_parse_malformed_json_leaves_text_unchanged():
    text = 'ok\n<tool_call>\n{"name": "calc", "arguments": {"expr": }\n</tool_call>'
    assert parse_tool_calls(text) == ([], text)
    assert parse_tool_calls('<tool_call>["no", "name"]</tool_call>') == (
        [],
        '<tool_call>["no", "name"]</tool_call>',
    )
    assert parse_tool_calls('<think>unfinished <tool_call>{"name": "a"}</tool_call>')[0] == []
    assert parse_tool_calls("plain") == ([], "plain")


def test_parse_string_arguments_kept_and_unknown_parser_refused():
    calls, rest = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert (calls[0].arguments, rest) == ('{"a": 1}', "")
    with pytest.raises(ValueError, match="unknown tool_call_parser"):
        parse_tool_calls("x", tool_call_parser="llama9")


# ChatML without tool syntax (SmolLM2's shape, without its default system prompt)
PLAIN_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture
def plain_chatml_tokenizer(tiny_tokenizer):
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = PLAIN_CHATML
    return tokenizer


def test_a_template_without_tool_syntax_is_shown_the_tools_in_the_system_message(plain_chatml_tokenizer):
    from areal_nb.capture.tool_specs import TOOLS_SECTION_END, TOOLS_SECTION_START, template_renders_tools

    assert not template_renders_tools(PLAIN_CHATML)
    assert template_renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = plain_chatml_tokenizer.decode(render_prompt_ids(plain_chatml_tokenizer, messages, TOOLS))
    section = TOOLS_SECTION_START + "\n" + json.dumps(TOOLS[0]) + TOOLS_SECTION_END
    assert text == (
        f"<|im_start|>system\nBe brief.\n\n{section}<|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # no system message: the section is one; no tools: nothing changes
    alone = plain_chatml_tokenizer.decode(render_prompt_ids(plain_chatml_tokenizer, messages[1:], TOOLS))
    assert alone.startswith(f"<|im_start|>system\n{section}<|im_end|>\n<|im_start|>user\n")
    assert render_prompt_ids(
        plain_chatml_tokenizer, messages, None
    ) == plain_chatml_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_earlier_tool_calls_render_as_the_text_the_model_wrote(plain_chatml_tokenizer):
    messages = [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    text = plain_chatml_tokenizer.decode(render_prompt_ids(plain_chatml_tokenizer, messages, TOOLS))
    assert f"<|im_start|>assistant\n{CALL_1}<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n" in text
    assert parse_tool_calls(CALL_1)[0][0].name == "calc"  # the parser reads back what the model was shown

"""Exact renderings of the tiny-math ChatML template (plain, system, tools, tool calls)."""

from __future__ import annotations

import json

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOL)
    + "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_plain_conversation(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "What is 3+4?"},
        {"role": "assistant", "content": "3+4=7. The answer is \\boxed{7}"},
        {"role": "user", "content": "Again?"},
    ]
    assert render(tiny_tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 3+4?<|im_end|>\n"
        "<|im_start|>assistant\n3+4=7. The answer is \\boxed{7}<|im_end|>\n"
        "<|im_start|>user\nAgain?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render(tiny_tokenizer, messages[:1]) == "<|im_start|>user\nWhat is 3+4?<|im_end|>\n"


def test_system_message_has_no_default(tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(tiny_tokenizer, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_tools_without_system_message(tiny_tokenizer):
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    assert render(tiny_tokenizer, messages, tools=[TOOL], add_generation_prompt=True) == (
        "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_merge_into_the_first_system_message(tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add."}]
    assert render(tiny_tokenizer, messages, tools=[TOOL]) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK + "<|im_end|>\n<|im_start|>user\nAdd.<|im_end|>\n"
    )


def test_assistant_tool_calls_with_dict_and_string_arguments(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "Add 2 and 3, then 4 and 5."},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":4,"b":5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "9"},
    ]
    assert render(tiny_tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>user\nAdd 2 and 3, then 4 and 5.<|im_end|>\n"
        "<|im_start|>assistant\nCalling.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a":4,"b":5}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tool_calls_without_content_and_flat_call_shape(tiny_tokenizer):
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"name": "add", "arguments": {"a": 1}}]},
    ]
    assert render(tiny_tokenizer, messages) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n'
    )


def test_list_content_renders_as_concatenated_text(tiny_tokenizer):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
    ]
    assert render(tiny_tokenizer, messages) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"


def test_exactly_one_eos_per_message(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "done"},
    ]
    out = tiny_tokenizer.apply_chat_template(messages, tokenize=True, tools=[TOOL])
    ids = out["input_ids"] if not isinstance(out, list) else out
    assert ids.count(tiny_tokenizer.eos_token_id) == len(messages)


def test_tokenized_chat_template_matches_encoding_the_text(tiny_tokenizer):
    messages = [{"role": "user", "content": "Mia has 3 apples. She gets 4 more."}]
    out = tiny_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if not isinstance(out, list) else out
    text = render(tiny_tokenizer, messages, add_generation_prompt=True)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids[-3:] == tiny_tokenizer.encode("<|im_start|>assistant\n")

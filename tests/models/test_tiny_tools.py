"""The `tiny-tools` tokenizer and warm-start data: short tool prompts, exact tokens, Qwen-style text.

(The model itself is exercised end to end by tests/test_tool_task.py.)
"""

from __future__ import annotations

import json
import random

import pytest

from areal_nb.capture.tool_calls import parse_tool_calls
from areal_nb.data.tool_task import CALCULATOR_TOOL, generate_tool_problems
from areal_nb.models import load_tokenizer
from areal_nb.models.tiny_tools import IGNORE, _sft_example, conversation, tool_call_text

ROW = generate_tool_problems(1, seed=5)[0]


@pytest.fixture(scope="module")
def tools_tokenizer():
    return load_tokenizer("tiny-tools")


def test_the_tools_prompt_is_short_and_renders_as_tiny_math_does(tools_tokenizer, tiny_tokenizer):
    text = tools_tokenizer.apply_chat_template(
        ROW["messages"], tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
    )
    # the same Qwen2.5-style text as tiny-math's template (tools preamble, <tools> JSON)
    assert text == tiny_tokenizer.apply_chat_template(
        ROW["messages"], tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
    )
    ids = tools_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) <= 40 < len(tiny_tokenizer.encode(text, add_special_tokens=False))
    assert tools_tokenizer.decode(ids) == text
    call = tool_call_text(ROW["expression"])
    assert len(tools_tokenizer.encode(call, add_special_tokens=False)) <= 12
    (parsed,), _ = parse_tool_calls(call)
    assert parsed.name == "calculator" and parsed.arguments == json.dumps({"expression": ROW["expression"]})


def test_every_digit_is_its_own_token(tools_tokenizer):
    ids = tools_tokenizer.encode("The answer is 1776.", add_special_tokens=False)
    assert [tools_tokenizer.decode([i]) for i in ids[-5:]] == ["1", "7", "7", "6", "."]


def test_warm_start_examples_train_on_the_replies_only(tools_tokenizer):
    messages = conversation(ROW, random.Random(0), direct=False)
    ids, labels = _sft_example(tools_tokenizer, messages)
    full = tools_tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)
    assert ids == tools_tokenizer.encode(full, add_special_tokens=False)  # turn by turn = all at once
    trained = tools_tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != IGNORE])
    answer = f"The answer is {ROW['answer']}."
    assert trained == tool_call_text(ROW["expression"]) + "<|im_end|>" + answer + "<|im_end|>"
    guess = conversation(ROW, random.Random(0), direct=True)
    assert (
        guess[-1]["content"].startswith("The answer is ")
        and guess[-1]["content"] != f"The answer is {ROW['answer']}."
    )

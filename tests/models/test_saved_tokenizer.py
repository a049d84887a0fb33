"""Saved model folders and `AutoTokenizer`: what SGLang, vLLM and a user's own script load.

transformers >= 5 makes every `model_type: qwen2` folder's tokenizer a `Qwen2Tokenizer`, which
rebuilds the pre-tokenizer with Qwen's word-splitting regex. `tiny-math`'s tokenizer (digits and
GPT-2-style words) encodes the same either way, so plain `AutoTokenizer` on its folder is right;
`tiny-tools`' (merges across spaces) does not, so its folders load through
`areal_nb.api.load_saved_tokenizer` — the engine's fallback tokenizer included.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from areal_nb.api.saved_tokenizer import load_saved_tokenizer
from areal_nb.data import CORRECTION_PROMPT, generate_problems, reference_reply
from areal_nb.data.tool_task import CALCULATOR_TOOL, generate_tool_problems

TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 37 times 48?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "37*48"}}}]},
    {"role": "tool", "content": "1776"},
    {"role": "assistant", "content": "The answer is 1776."},
]


def math_conversations(n: int = 50) -> list[list[dict]]:
    return [[{"role": "user", "content": p["question"]}, {"role": "assistant", "content": "The answer is 3."},
             {"role": "user", "content": CORRECTION_PROMPT}, {"role": "assistant", "content": reference_reply(p)}]
            for p in generate_problems(n, seed=11)]


def renders_and_ids(tokenizer, conversations, tools=None) -> tuple[list[str], list[list[int]]]:
    texts = [tokenizer.apply_chat_template(c, tools=tools, tokenize=False) for c in conversations]
    return texts, [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def tiny_tools_folder(tmp_path_factory, tools_tokenizer_dir):
    """A `tiny-tools` model folder as `save_model` writes it (untrained weights: building the
    real one takes minutes and the tokenizer files are the same)."""
    from areal_nb.models.tiny_tools import TOOLS_SFT_RECIPE
    from areal_nb.models.warm_start import new_model, save_model

    tokenizer = load_saved_tokenizer(tools_tokenizer_dir)
    folder = tmp_path_factory.mktemp("tiny-tools-model")
    torch.manual_seed(0)
    save_model(new_model(tokenizer, TOOLS_SFT_RECIPE), tokenizer, folder)
    return folder


@pytest.fixture(scope="module")
def tools_tokenizer_dir(tmp_path_factory):
    """A tokenizer-only folder as `build_tools_tokenizer` trains and saves it (no config.json; a few
    seconds), built here because the shipped tiny-tools folder holds a model beside its tokenizer."""
    from areal_nb.models.registry import tiny_math_tokenizer_dir
    from areal_nb.models.tiny_tools import build_tools_tokenizer

    folder = tmp_path_factory.mktemp("tiny-tools-tokenizer")
    build_tools_tokenizer(folder, tiny_math_tokenizer_dir())
    return folder


def test_plain_autotokenizer_reads_the_tiny_math_folder_as_trained(tiny_model_path):
    auto, ours = AutoTokenizer.from_pretrained(tiny_model_path), load_saved_tokenizer(tiny_model_path)
    for conversations, tools in [(math_conversations(), None), ([TOOL_CONVERSATION], [CALCULATOR_TOOL])]:
        assert renders_and_ids(auto, conversations, tools) == renders_and_ids(ours, conversations, tools)
    assert (auto.eos_token_id, auto.pad_token_id) == (ours.eos_token_id, ours.pad_token_id)


def test_the_tiny_tools_folder_loads_as_trained_and_plain_autotokenizer_does_not(tiny_tools_folder, tools_tokenizer_dir):
    trained = load_saved_tokenizer(tools_tokenizer_dir)  # the folder it was trained in (no config.json)
    rng = random.Random(0)
    from areal_nb.models.tiny_tools import conversation

    conversations = [TOOL_CONVERSATION] + [conversation(r, rng, direct=False) for r in generate_tool_problems(20, seed=4)]
    expected = renders_and_ids(trained, conversations, [CALCULATOR_TOOL])
    assert renders_and_ids(load_saved_tokenizer(tiny_tools_folder), conversations, [CALCULATOR_TOOL]) == expected

    # What goes wrong without it: the same files, re-split into words (the chat template and the
    # decoding are unchanged, the ids are not). If transformers stops doing this, plain
    # AutoTokenizer is enough again and this assertion says so.
    auto = AutoTokenizer.from_pretrained(tiny_tools_folder)
    texts, ids = renders_and_ids(auto, conversations, [CALCULATOR_TOOL])
    assert texts == expected[0] and auto.decode(expected[1][0]) == trained.decode(expected[1][0])
    assert sum(map(len, ids)) > 2 * sum(map(len, expected[1]))


def test_the_engine_loads_the_folders_tokenizer_as_trained(tiny_tools_folder, tools_tokenizer_dir):
    from areal_nb.engine import LocalEngine

    engine = LocalEngine(str(tiny_tools_folder), device="cpu")
    try:
        text = engine.tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=[CALCULATOR_TOOL], tokenize=False)
        trained = load_saved_tokenizer(tools_tokenizer_dir)
        assert engine.tokenizer.encode(text) == trained.encode(text)
    finally:
        engine.close()

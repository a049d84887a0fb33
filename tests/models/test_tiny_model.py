"""The built tiny-math model: loads through transformers, learnt something, stays well-formed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_nb.data import CORRECTION_PROMPT, generate_problems, reply_for
from areal_nb.errors import InvalidArgumentError
from areal_nb.models import TINY_MATH, evaluate_accuracy, load_model, resolve_model_path
from areal_nb.models.evaluation import generate_replies

REPLY_FORMAT = re.compile(r"^\\boxed\{\d+\}$")


@pytest.fixture(scope="module")
def tiny_model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.fixture(scope="module")
def held_out():
    return generate_problems(200, split="test")


def test_build_info_records_the_measured_accuracy(tiny_model_path):
    info = json.loads((Path(tiny_model_path) / "build_info.json").read_text())
    assert info["name"] == TINY_MATH
    assert info["held_out_problems"] == 200
    assert 0.05 < info["held_out_accuracy"] < 0.9
    assert 1_000_000 <= info["parameters"] <= 6_000_000


def test_tiny_math_is_a_qwen2_saved_for_auto_classes(tiny_model_path, tiny_model):
    assert resolve_model_path(TINY_MATH) == tiny_model_path
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert type(tiny_model).__name__ == "Qwen2ForCausalLM"
    assert not tiny_model.training
    assert next(tiny_model.parameters()).dtype == torch.float32
    config = tiny_model.config
    assert (config.eos_token_id, config.pad_token_id) == (2, 0)
    assert config.tie_word_embeddings and config.max_position_embeddings == 512
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    assert config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>"


def test_save_and_reload_gives_identical_logits(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 5, 6, 7, 2]])
    with torch.no_grad():
        assert torch.equal(tiny_model(ids).logits, reloaded(ids).logits)


def test_held_out_accuracy_shows_it_learnt_something(tiny_model, tiny_tokenizer, held_out, tiny_model_path):
    accuracy = evaluate_accuracy(tiny_model, tiny_tokenizer, held_out)
    assert accuracy > 0.05
    recorded = json.loads((Path(tiny_model_path) / "build_info.json").read_text())
    assert abs(accuracy - recorded["held_out_accuracy"]) <= 0.02


def test_left_padded_batches_match_one_by_one_generation(tiny_model, tiny_tokenizer, held_out):
    conversations = [p["messages"] for p in held_out[:8]]
    batched = generate_replies(tiny_model, tiny_tokenizer, conversations, batch_size=8)
    single = [generate_replies(tiny_model, tiny_tokenizer, [c], batch_size=1)[0] for c in conversations]
    assert batched == single


def test_first_and_second_turn_replies_are_well_formed(tiny_model, tiny_tokenizer, held_out):
    first = generate_replies(tiny_model, tiny_tokenizer, [p["messages"] for p in held_out[:32]])
    assert sum(bool(REPLY_FORMAT.match(r)) for r in first) >= 30
    second_turn = [
        p["messages"]
        + [
            {"role": "assistant", "content": reply_for(p, int(p["answer_value"]) + 1)},
            {"role": "user", "content": CORRECTION_PROMPT},
        ]
        for p in held_out[:32]
    ]
    second = generate_replies(tiny_model, tiny_tokenizer, second_turn)
    assert sum(bool(REPLY_FORMAT.match(r)) for r in second) >= 30


def test_evaluate_accuracy_needs_problems(tiny_model, tiny_tokenizer):
    with pytest.raises(InvalidArgumentError, match="at least one problem"):
        evaluate_accuracy(tiny_model, tiny_tokenizer, [])

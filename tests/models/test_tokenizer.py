"""The tiny-math tokenizer: digits, special tokens, exact round-trip, save/reload."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from areal_nb.models.cache import cache_root
from areal_nb.models.registry import tiny_math_tokenizer_dir
from areal_nb.models.tokenizer import build_tokenizer

ROUND_TRIP_TEXTS = [
    "Mia has 12 apples. She gets 305 more. How many apples does Mia have now?",
    "3+4=7. The answer is \\boxed{7}",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>',
    "<think>hmm</think>  spaces\tand tabs\n\nnew lines",
    "unicode: héllo 你好 🙂 — ok",
    "",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_decode_encode_round_trips_exactly(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_every_digit_is_its_own_token(tiny_tokenizer):
    digit_ids = [tiny_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert len(set(digit_ids)) == 10
    ids = tiny_tokenizer.encode("1234567890", add_special_tokens=False)
    assert ids == digit_ids[1:] + digit_ids[:1]
    ids = tiny_tokenizer.encode("x=98", add_special_tokens=False)
    assert ids[-2:] == [digit_ids[9], digit_ids[8]]


def test_special_tokens_and_ids(tiny_tokenizer):
    tok = tiny_tokenizer
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [2]
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)
    assert 400 <= len(tok) <= 600


def test_markup_tokens_are_single_non_special_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    for markup in [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<tool_response>",
        "</tool_response>",
    ]:
        ids = tok.encode(markup, add_special_tokens=False)
        assert len(ids) == 1, markup
        assert markup not in tok.all_special_tokens
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    # Like Qwen2.5: the tool-call markup survives skip_special_tokens, the ChatML markers do not.
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


def test_tokenizer_build_is_deterministic(tmp_path):
    a = build_tokenizer(tmp_path / "a")
    b = build_tokenizer(tmp_path / "b")
    assert a.get_vocab() == b.get_vocab()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_saved_tokenizer_reloads_through_auto_tokenizer(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "A jar holds 8 toy cars. Nora takes 8 out."
    assert reloaded.encode(text) == tiny_tokenizer.encode(text)
    assert reloaded.chat_template == tiny_tokenizer.chat_template
    assert reloaded.eos_token_id == 2 and reloaded.pad_token_id == 0


def test_tokenizer_is_cached_under_areal_nb_cache(monkeypatch, tmp_path):
    from areal_nb.models import shipped

    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path))
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "nothing-shipped")  # built on first use, as unshipped
    assert cache_root() == tmp_path
    first = tiny_math_tokenizer_dir()
    assert first.parent == tmp_path / "tiny-math"
    assert first.name.startswith("tokenizer-")
    assert (first / "tokenizer.json").is_file()
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert tiny_math_tokenizer_dir() == first  # second call reuses the build
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp
    assert not [p for p in first.parent.iterdir() if ".tmp-" in p.name]

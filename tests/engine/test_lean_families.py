"""The lean forward computes what each family's transformers forward computes: Llama (with and
without q/k/v/o and MLP biases, a scaled RoPE), Mistral, Qwen2, Qwen3 (per-head q/k norms) and
Gemma (scaled embeddings, (1 + weight) norms, GELU-tanh MLP), on tiny random configs with grouped,
multi-head and multi-query attention.

Norm weights and biases are randomised after init (their init values, ones and zeros, would hide
a norm or bias the lean path dropped or added)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from engine_test_helpers import teacher_forced_logprobs
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    GemmaConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.engine.kv_batch import PaddedKVBatch
from areal_nb.engine.lean_forward import LeanForward

VOCAB = 101
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
}


def family_config(family: str):
    if family == "llama":
        return LlamaConfig(**SHAPE)
    if family == "llama-biases":  # every projection biased, no GQA, linear RoPE scaling
        return LlamaConfig(
            **{**SHAPE, "num_key_value_heads": 4},
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        )
    if family == "mistral":  # a window wider than every position: never bites
        return MistralConfig(**SHAPE, sliding_window=4096)
    if family == "qwen2":  # q/k/v biases
        return Qwen2Config(**SHAPE)
    if family == "qwen3":  # head_dim wider than hidden / heads
        return Qwen3Config(**SHAPE, head_dim=32)
    if family == "gemma":  # multi-query attention
        return GemmaConfig(**{**SHAPE, "num_key_value_heads": 1, "tie_word_embeddings": True}, head_dim=16)
    raise ValueError(family)


FAMILIES = ["llama", "llama-biases", "mistral", "qwen2", "qwen3", "gemma"]


def family_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(family)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model


def _assert_rows_match_the_stock_forward(model, rows, logits) -> None:
    with torch.inference_mode():
        for row, got in zip(rows, logits, strict=True):
            want = model(torch.tensor([row])).logits[0, -1]
            assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())


def _check_ragged_decoding(model) -> None:
    """Prefill of ragged prompts, decoding steps, rows leaving, rows joining the running batch: every
    row's next-token logits equal the stock forward over that row alone, unpadded."""
    batch = PaddedKVBatch(model)
    assert isinstance(batch.fast, LeanForward)
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (3, 17, 9, 1)]

    def step(logits):
        for row, token in zip(rows, logits.argmax(-1).tolist(), strict=True):
            row.append(token)
        return batch.decode(torch.tensor([row[-1] for row in rows]))

    with torch.inference_mode():
        logits = batch.prefill([list(r) for r in rows])
        _assert_rows_match_the_stock_forward(model, rows, logits)
        for _ in range(4):
            logits = step(logits)
            _assert_rows_match_the_stock_forward(model, rows, logits)
        batch.keep_rows([3, 0])  # the longest rows leave
        rows[:], logits = [rows[3], rows[0]], logits[[3, 0]]
        logits = step(logits)
        _assert_rows_match_the_stock_forward(model, rows, logits)
        joined = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (30, 5)]
        logits = torch.cat([logits, batch.prefill([list(r) for r in joined])])
        rows += joined
        _assert_rows_match_the_stock_forward(model, rows, logits)
        for _ in range(3):
            logits = step(logits)
            _assert_rows_match_the_stock_forward(model, rows, logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_logits_equal_the_stock_forward_over_ragged_batches(family):
    _check_ragged_decoding(family_model(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_logprobs_of_a_greedy_generation_equal_the_stock_forwards(family):
    model = family_model(family)
    rng = random.Random(0)
    requests = [
        ModelRequest(
            input_ids=[rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 20))],
            gconfig=GenerationConfig(max_new_tokens=rng.randint(4, 12), greedy=True, ignore_eos=True),
        )
        for _ in range(5)
    ]
    with LocalEngine(model, device="cpu", seed=0) as engine:
        assert isinstance(engine._batch.fast, LeanForward)

        async def run():
            return await asyncio.gather(*(engine.agenerate(r) for r in requests))

        responses = asyncio.run(run())
    for request, response in zip(requests, responses, strict=True):
        assert response.output_len == request.gconfig.max_new_tokens
        want = teacher_forced_logprobs(model, response.input_tokens, response.output_tokens)
        got = torch.tensor(response.output_logprobs)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
        with torch.inference_mode():  # greedy: each token is the stock forward's argmax
            logits = model(torch.tensor([response.input_tokens + response.output_tokens])).logits[0]
        assert logits[len(response.input_tokens) - 1 : -1].argmax(-1).tolist() == response.output_tokens


@pytest.mark.parametrize(
    "config",
    [
        MistralConfig(**SHAPE, sliding_window=8),  # keys fall out of the window
        Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=8, max_window_layers=1),
        LlamaConfig(**SHAPE, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
        LlamaConfig(**SHAPE, hidden_act="relu"),
        Gemma2Config(**SHAPE, head_dim=16),  # another class (soft-capping, sandwich norms)
    ],
    ids=["mistral-window", "qwen2-sliding-layers", "dynamic-rope", "relu", "gemma2"],
)
def test_shapes_the_lean_forward_does_not_compute_go_through_the_stock_forward(config):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert not LeanForward.supports(model)
    assert PaddedKVBatch(model).fast is None


@pytest.mark.parametrize("family", ["qwen3", "gemma"])
def test_the_check_fails_without_qwen3s_head_norms_or_gemmas_unit_offset(family, monkeypatch):
    """(Without this the checks above could not catch a family detail the lean path drops.)"""
    from areal_nb.engine import lean_forward

    if family == "qwen3":
        monkeypatch.setattr(lean_forward._HeadNorm, "__call__", lambda self, qk: qk)
    else:
        monkeypatch.setitem(lean_forward._FAMILIES, "GemmaForCausalLM", False)
    with pytest.raises(AssertionError):
        _check_ragged_decoding(family_model(family))

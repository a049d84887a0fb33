"""Training memory: the log-softmax in chunks of tokens (forward and backward), micro-batches
bounded by tokens, gradient checkpointing, and the estimate that refuses a config that cannot fit."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.memory import (
    ModelShape,
    TrainMemoryError,
    check_fits,
    check_train_memory,
    estimate_train_memory,
)
from areal_nb.train.microbatch import split_micro_batches

from .conftest import VOCAB, make_tiny_qwen2
from .test_actor import make_batch

CHUNK = 3
HIDDEN = make_tiny_qwen2().config.hidden_size
LAYOUTS = {
    "padded": {"pack": False},
    "flat": {},
    "flat, whole last layer": {"last_layer_at_heads": False},
    "dense": {"tree_attention": False},
}


class LargestVocabTensor(TorchDispatchMode):
    """The most rows of any float32 [..., VOCAB] tensor an op produces (forward and backward),
    the LM head's weight and its gradient ([HIDDEN, VOCAB] views) aside."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float32
                and t.dim()
                and t.shape[-1] == VOCAB
                and t.numel() != HIDDEN * VOCAB
            ):
                self.rows = max(self.rows, t.numel() // VOCAB)
        return out


def one_step(chunk: int, **cfg):
    model = make_tiny_qwen2()
    actor = Actor(model, GRPOConfig(lr=1e-3, adam_eps=1.0, logprob_chunk_size=chunk, **cfg))
    batch = make_batch(make_tiny_qwen2())
    watch = LargestVocabTensor()
    with watch:
        stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 1, 1])))
    return stats, model, watch.rows


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunked_log_softmax_equals_the_whole_and_never_holds_more_than_a_chunk(layout):
    whole, whole_model, whole_rows = one_step(0, **LAYOUTS[layout])
    chunked, chunked_model, chunked_rows = one_step(CHUNK, **LAYOUTS[layout])
    assert whole_rows > CHUNK  # (the check can fail: the whole micro-batch's vocabulary tensor)
    assert chunked_rows <= CHUNK
    assert chunked["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert chunked["entropy"] == pytest.approx(whole["entropy"], abs=1e-6)
    assert chunked["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    for (name, p), q in zip(whole_model.named_parameters(), chunked_model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def test_micro_batches_by_token_budget():
    rows = torch.arange(5)
    lengths = torch.tensor([4, 3, 5, 9, 2])

    def split(rows_max, tokens_max):
        return [m.tolist() for m in split_micro_batches(rows, lengths, rows_max, tokens_max)]

    assert split(None, 8) == [[0, 1], [2], [3], [4]]  # 9 > 8 runs alone
    assert split(None, 12) == [[0, 1, 2], [3, 4]]
    assert split(1, 100) == [[0], [1], [2], [3], [4]]
    assert split(2, 10) == [[0, 1], [2], [3], [4]]
    assert split(None, None) == [[0, 1, 2, 3, 4]]
    assert split_micro_batches(rows[:0], lengths, None, 8) == []


@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_token_budget_and_gradient_checkpointing_give_the_same_update(layout):
    whole, whole_model, _ = one_step(0, **LAYOUTS[layout])
    budget, budget_model, _ = one_step(
        0, max_tokens_per_microbatch=8, **LAYOUTS[layout]
    )  # rows of 5-8 tokens
    ckpt, ckpt_model, _ = one_step(CHUNK, gradient_checkpointing=True, **LAYOUTS[layout])
    for stats, model in ((budget, budget_model), (ckpt, ckpt_model)):
        assert stats["loss"] == pytest.approx(whole["loss"], abs=1e-6)
        assert stats["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
        for (name, p), q in zip(whole_model.named_parameters(), model.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-6), name


def test_memory_estimate_arithmetic():
    shape = ModelShape(params=1000, layers=2, hidden=8, intermediate=16, vocab=100)
    # bf16: gradients + AdamW 12 B/param, the cast copy 2 B/param; per token per layer 8h + 2(6h + 5i)
    # = 64 + 256 = 320 B; log-softmax (2 + 12) B per vocabulary entry of each token
    est = estimate_train_memory(shape, tokens=10, compute_bytes=2)
    assert (est.optimizer, est.activations, est.logprobs) == (14000, 10 * 2 * 320, 10 * 100 * 14)
    assert est.total == 14000 + 6400 + 14000
    assert estimate_train_memory(shape, tokens=10, compute_bytes=2, chunk=4).logprobs == 4 * 100 * 14
    # checkpointing keeps each layer's input (4h per token per layer) plus one layer's activations
    assert estimate_train_memory(shape, 10, 2, gradient_checkpointing=True).activations == 10 * (2 * 32 + 320)
    fp32 = estimate_train_memory(shape, 10, 4, shards=2)
    assert fp32.optimizer == 12000 // 2 and fp32.activations == 10 * 2 * (64 + 4 * 128)
    assert estimate_train_memory(shape, None, 2).total == 14000  # no token budget: activations unknown


def test_memory_check_names_the_setting_to_change():
    shape = ModelShape(params=1000, layers=2, hidden=8, intermediate=16, vocab=100)
    est = estimate_train_memory(shape, tokens=10, compute_bytes=2)  # 34,400 B
    check_fits(est, free_bytes=40000)  # 90 % of it: 36,000
    with pytest.raises(TrainMemoryError, match="actor.max_tokens_per_microbatch"):
        check_fits(est, free_bytes=38000)
    with pytest.raises(TrainMemoryError, match="actor.parallel=fsdp"):
        check_fits(est, free_bytes=15000)


def test_memory_check_of_a_real_model_with_a_fake_device():
    """The figures a Qwen2.5-0.5B-shaped actor would be refused with on a 24 GiB device."""
    model = make_tiny_qwen2()
    cfg = GRPOConfig(max_tokens_per_microbatch=16384)
    small = check_train_memory(model, cfg, torch.bfloat16, free_bytes=10**9)
    assert small.tokens == 16384 and small.optimizer == 14 * sum(p.numel() for p in model.parameters())
    with pytest.raises(TrainMemoryError, match="16384 tokens.*actor.gradient_checkpointing"):
        check_train_memory(model, cfg, torch.float32, free_bytes=small.optimizer * 2)

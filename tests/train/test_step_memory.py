"""Training memory stays flat across steps: a train step leaves nothing behind that the next one
adds to (the tensors alive after each step, counted and summed, are those after the second: the
weights, AdamW's state, the last inspection), and the heap memory a step freed is handed back to
the OS (`train.heap`), so the process's resident memory follows what it holds."""

import gc
import platform

import pytest
import torch

from areal_nb.train import Actor, GRPOConfig, TrainBatch
from areal_nb.train.heap import release_freed_memory

from .conftest import VOCAB, make_tiny_qwen2

pytestmark = pytest.mark.slow


def live_tensors() -> tuple[int, int]:
    """(count, bytes) of the tensors Python holds."""
    gc.collect()
    tensors = [o for o in gc.get_objects() if torch.is_tensor(o)]
    return len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def batch_of(step: int, rows: int = 8) -> tuple[dict, list[int]]:
    """Rows of other lengths every step (prompts shared per group of 4), like real rollouts; one
    width, so the last inspection's [rows, width] tensors are the same size every step."""
    gen = torch.Generator().manual_seed(step)
    width = 40
    input_ids = torch.randint(2, VOCAB, (rows, width), generator=gen)
    lengths = torch.randint(8, width + 1, (rows,), generator=gen)
    lengths[0] = width
    attention = torch.arange(width)[None] < lengths[:, None]
    for first in range(0, rows, 4):
        input_ids[first : first + 4, :5] = input_ids[first, :5]
    loss_mask = attention.clone()
    loss_mask[:, :5] = False
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask.float(),
        "logprobs": torch.where(loss_mask, -3.0, 0.0),
        "versions": torch.where(loss_mask, step, -1),
        "rewards": torch.rand(rows, generator=gen),
    }
    return batch, [r // 4 for r in range(rows)]


@pytest.mark.parametrize("minibatches", [1, 2])
def test_a_train_step_leaves_nothing_behind(minibatches):
    actor = Actor(
        make_tiny_qwen2(), GRPOConfig(lr=1e-3, use_decoupled_loss=True, ppo_n_minibatches=minibatches)
    )
    after = []
    for step in range(6):
        tensors, groups = batch_of(step)
        actor.train_step(TrainBatch(**tensors, group_ids=torch.tensor(groups)), inspect=True)
        after.append(live_tensors())
    # the first step creates AdamW's state; from the second on every step leaves the same
    assert after[1][0] > 0
    assert after[2:] == [after[1]] * 4, after


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_on_glibc():
    assert release_freed_memory() is True

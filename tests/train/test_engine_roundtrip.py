"""The trainer against the real LocalEngine: recorded log-probs equal recomputed ones before
the first update, pushed weights carry version + 1, and staleness is read from `versions`."""

import pytest
import torch

from areal_nb.api import GenerationConfig
from areal_nb.api.train_batch import TrainBatch
from areal_nb.testing import sample_batch
from areal_nb.train import Actor, GRPOConfig

from .conftest import make_tiny_qwen2

PROMPTS = [[2, 3, 4], [5, 6, 7, 8]]


def rollout(engine, n_samples=3, temperature=1.0):
    """Sample n completions per prompt as one training batch (the capture layer's tensor layout)."""
    gconfig = GenerationConfig(max_new_tokens=6, temperature=temperature)
    # any deterministic rule that varies between samples will do: the mean output token id
    return sample_batch(
        engine, PROMPTS, gconfig, lambda r: sum(r.output_tokens) / max(r.output_len, 1), n_samples
    )


@pytest.fixture
def engine_and_actor():
    from areal_nb.engine import LocalEngine

    model = make_tiny_qwen2()
    engine = LocalEngine(model, device="cpu", seed=0)
    try:
        yield engine, Actor(model, GRPOConfig(lr=1e-2), version=engine.get_version(), temperature=0.8)
    finally:
        engine.close()


def test_recorded_logprobs_equal_recomputed_and_versions_advance(engine_and_actor):
    engine, actor = engine_and_actor
    batch, group_ids = rollout(engine, temperature=0.8)
    assert batch["loss_mask"].sum() > 0
    head_before = actor.model.lm_head.weight.detach().clone()
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
    assert stats["logprob_abs_diff_max"] < 1e-4
    assert stats["adv_max"] > 0 and not torch.equal(head_before, actor.model.lm_head.weight)
    assert stats["importance_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["staleness_max"] == 0.0

    assert actor.push_weights(engine) == 1
    assert engine.get_version() == 1
    fresh, fresh_groups = rollout(engine, temperature=0.8)
    generated = fresh["versions"][fresh["loss_mask"].bool()]
    assert (generated == 1).all()
    # The new engine weights are the trained ones: recorded log-probs match again.
    stats = actor.train_step(TrainBatch(**fresh, group_ids=torch.as_tensor(fresh_groups)))
    assert stats["logprob_abs_diff_max"] < 1e-4
    assert stats["staleness_max"] == 0.0

    # A batch sampled two versions ago (offpolicyness 2) is at most 2 versions old.
    stats = actor.train_step(
        TrainBatch(
            **concat_batches(batch, fresh),
            group_ids=torch.as_tensor(group_ids + [g + 10 for g in fresh_groups]),
        )
    )
    assert stats["version"] == 2.0
    assert stats["staleness_max"] == 2.0
    assert 0.0 < stats["staleness_mean"] < 2.0


def concat_batches(a, b):
    width = max(a["input_ids"].shape[1], b["input_ids"].shape[1])
    out = {}
    for key in a:
        if a[key].dim() == 1:
            out[key] = torch.cat([a[key], b[key]])
            continue
        fill = -1 if key == "versions" else 0
        out[key] = torch.cat(
            [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill) for t in (a[key], b[key])]
        )
    return out

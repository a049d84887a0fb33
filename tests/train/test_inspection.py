"""Actor.train_step(inspect=True): the per-token values of the update, checked against the
formulas they come from, and proof that inspecting does not change the update."""

import copy
import math

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig

from .test_actor import make_batch


def test_inspecting_leaves_the_update_unchanged(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    twin = copy.deepcopy(tiny_qwen2)
    plain = Actor(tiny_qwen2, GRPOConfig(lr=1e-3)).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    actor = Actor(twin, GRPOConfig(lr=1e-3))
    inspected = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])), inspect=True)
    for p, q in zip(tiny_qwen2.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert plain["loss"] == inspected["loss"]
    assert actor.last_inspection is not None and actor.last_inspection.version == 0


def test_ratios_clipping_and_contributions_follow_the_formulas(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    # the engine was more sure than the trained policy by 0.5 nats on every generated token:
    # r = exp(-0.5) < 1 - eps_clip, so the negative-advantage rows (1 and 3) are clipped
    batch["logprobs"] = batch["logprobs"] + 0.5 * batch["loss_mask"]
    actor = Actor(tiny_qwen2, GRPOConfig(recompute_logprob=False, eps_clip=0.2))
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])), inspect=True)
    ins = actor.last_inspection
    mask = ins.loss_mask
    assert torch.allclose(ins.ratio[mask], torch.exp(ins.logprobs - ins.old_logprobs)[mask], atol=1e-6)
    assert torch.allclose(ins.ratio[mask], torch.full_like(ins.ratio[mask], math.exp(-0.5)), atol=1e-5)
    expected_clipped = mask & (
        ((ins.ratio < 0.8) & (ins.advantages < 0)) | ((ins.ratio > 1.2) & (ins.advantages > 0))
    )
    assert torch.equal(ins.clipped, expected_clipped)
    assert [bool(ins.clipped[i][mask[i]].all()) for i in range(4)] == [False, True, False, True]
    # per token: max(-A r, -A clip(r)) / number of trained tokens; they sum to the loss
    clipped_r = ins.ratio.clamp(0.8, 1.2)
    expected = torch.where(mask, torch.maximum(-ins.advantages * ins.ratio, -ins.advantages * clipped_r), 0.0)
    assert torch.allclose(ins.contribution, expected / mask.sum(), atol=1e-7)
    assert float(ins.contribution.sum()) == pytest.approx(stats["loss"], abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(float(ins.clipped.sum() / mask.sum()))
    assert not ins.behave_capped.any() and torch.equal(ins.behave_weight, torch.ones_like(ins.behave_weight))
    assert (ins.entropy[mask] > 0).all() and (ins.entropy[~mask] == 0).all()
    row = ins.row(1)
    assert len(row["input_ids"]) == 3 + 3 and row["reward"] == 0.0 and all(row["clipped"][3:])


def test_capped_behaviour_weights_are_marked_and_contribute_nothing(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    batch["logprobs"][0] = batch["logprobs"][0] - 3.0 * batch["loss_mask"][0]  # w = e^3 > cap 5 on row 0
    actor = Actor(
        tiny_qwen2, GRPOConfig(use_decoupled_loss=True, behave_imp_weight_cap=5.0, ppo_n_minibatches=2)
    )
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])), inspect=True)
    ins = actor.last_inspection
    mask = ins.loss_mask
    assert torch.equal(ins.behave_capped, mask & (torch.arange(4)[:, None] == 0))
    assert torch.allclose(ins.behave_weight[0][mask[0]], torch.full((4,), math.exp(3.0)), rtol=1e-5)
    assert (ins.contribution[0] == 0).all() and (ins.contribution[2][mask[2]] != 0).all()
    assert ins.minibatch.tolist() == [0, 0, 1, 1]
    assert torch.allclose(
        ins.behave_weight[mask], torch.exp(ins.prox_logprobs - ins.old_logprobs)[mask], rtol=1e-5
    )
    assert stats["behave_masked_frac"] == pytest.approx(4 / 14)
    with pytest.raises(IndexError, match="out of range"):
        ins.row(4)

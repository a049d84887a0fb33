"""The algorithm presets inside `Actor.train_step`: grpo trains exactly as the trainer did before
the presets existed, every preset trains, the mismatch metrics come with every step."""

import copy

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig, actor_update
from areal_nb.train.algorithms import ALGORITHMS
from areal_nb.train.loss import ppo_loss_terms

from .conftest import make_tiny_qwen2
from .test_actor import make_batch

GROUPS = [0, 0, 1, 1]


def todays_loss_terms(cfg, logprobs, old, adv, mask, prox, engine, entropy, normalizer):
    """The trainer's loss call as it was written before the presets (one objective, token mean)."""
    terms = ppo_loss_terms(
        logprobs,
        old,
        adv,
        mask,
        eps_clip=cfg.eps_clip,
        eps_clip_higher=cfg.eps_clip_higher,
        c_clip=cfg.c_clip,
        prox_logprobs=prox if cfg.use_decoupled_loss else None,
        behave_imp_weight_cap=cfg.behave_imp_weight_cap if cfg.use_decoupled_loss else None,
        entropy=entropy,
        normalizer=normalizer,
    )
    return terms, None


def train_and_record(actor, batch, steps=2):
    """Loss, the gradients the optimizer stepped with, and the weights after `steps` steps."""
    grads = []
    step = actor.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append([p.grad.detach().clone() for p in actor.params])
        return step(*args, **kwargs)

    actor.optimizer.step = recording_step
    losses = [
        actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)))["loss"] for _ in range(steps)
    ]
    return losses, grads, {k: v.clone() for k, v in actor.model.state_dict().items()}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"use_decoupled_loss": True, "eps_clip_higher": 0.28, "c_clip": 3.0, "ppo_n_minibatches": 2},
        {"micro_batch_size": 1, "pack": False},
    ],
)
def test_grpo_preset_is_bit_identical_to_the_trainer_before_presets(monkeypatch, kwargs):
    batch = make_batch(make_tiny_qwen2(), versions=[0, 0, 0, 0])
    batch["logprobs"] = batch["logprobs"] + 0.05 * batch["loss_mask"]  # an engine that differs a little
    ours = train_and_record(Actor(make_tiny_qwen2(), GRPOConfig(algorithm="grpo", lr=1e-2, **kwargs)), batch)
    monkeypatch.setattr(actor_update, "variant_loss_terms", todays_loss_terms)
    monkeypatch.setattr(actor_update, "loss_normalizer", lambda mask, rows, *a: max(int(mask[rows].sum()), 1))
    today = train_and_record(Actor(make_tiny_qwen2(), GRPOConfig(lr=1e-2, **kwargs)), batch)
    assert ours[0] == today[0]
    for ours_step, today_step in zip(ours[1], today[1], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours_step, today_step, strict=True))
    assert all(torch.equal(ours[2][k], today[2][k]) for k in ours[2])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_preset_trains_a_step_and_moves_the_weights(algorithm):
    model = make_tiny_qwen2()
    batch = make_batch(model)
    before = copy.deepcopy(model.state_dict())
    stats = Actor(model, GRPOConfig(algorithm=algorithm, lr=1e-2)).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_mismatch_metrics_come_with_every_step_and_mis_masks_the_planted_tokens():
    model = make_tiny_qwen2()
    batch = make_batch(model)
    mask = batch["loss_mask"].bool()
    planted = torch.zeros_like(batch["logprobs"])
    planted[0, 3] = (
        2.0  # the engine recorded this token 2 nats less likely than the trainer computes: w = e^2
    )
    batch["logprobs"] = batch["logprobs"] - planted
    plain = Actor(copy.deepcopy(model), GRPOConfig()).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS))
    )
    n = int(mask.sum())
    assert plain["mismatch_logp_abs_diff"] == pytest.approx(2.0 / n, abs=1e-5)
    assert plain["mismatch_masked_frac"] == 0.0
    actor = Actor(copy.deepcopy(model), GRPOConfig(mismatch_correction="mis", mismatch_threshold=2.0))
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)), inspect=True)
    assert stats["mismatch_masked_frac"] == pytest.approx(1 / n)
    assert stats["mismatch_kl_k3"] == pytest.approx((float(torch.tensor(2.0).exp()) - 1 - 2.0) / n, abs=1e-4)
    # the masked token adds nothing to the loss
    assert float(actor.last_inspection.contribution[0, 3]) == 0.0
    assert float(actor.last_inspection.contribution[0, 4]) != 0.0

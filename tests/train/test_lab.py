"""The algorithm lab on a real (tiny, random) Qwen2: each variant's loss is its own train step's,
nothing about the actor changes, the gradients' cosines and the trial step are what they claim."""

import copy
import random

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.session.lab import Comparison, variant_configs
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.lab import compare_variants, cosine_matrix

from .conftest import make_tiny_qwen2
from .test_actor import make_batch

GROUPS = [0, 0, 1, 1]
VARIANTS = {
    "grpo": {},
    "dr_grpo": {},
    "gspo": {"recompute_logprob": False},
    "cispo": {},
    "rloo": {},
    "tis": {"algorithm": "grpo", "mismatch_correction": "mis", "mismatch_threshold": 1.5},
}


def stale_batch(model):
    batch = make_batch(model, rewards=(1.0, 0.0, 0.5, 0.0))
    batch["logprobs"] = batch["logprobs"] + 0.3 * batch["loss_mask"] * torch.tensor(
        [[1.0], [-2.0], [0.5], [2.0]]
    )
    return batch


def test_each_variants_loss_is_its_own_train_step_loss():
    model = make_tiny_qwen2()
    actor = Actor(model, GRPOConfig(lr=1e-2))
    batch = stale_batch(model)
    configs = variant_configs(actor.cfg, VARIANTS)
    results = compare_variants(actor, TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)), configs)
    for r in results:
        own = Actor(copy.deepcopy(model), r.cfg).train_step(
            TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS))
        )
        assert r.loss == pytest.approx(own["loss"], abs=1e-6), r.name
        assert r.grad_norm == pytest.approx(own["grad_norm"], rel=1e-5), r.name
    by_name = {r.name: r for r in results}
    assert by_name["tis"].masked.any() and not by_name["grpo"].masked.any()  # MIS dropped the far-off row
    assert by_name["gspo"].clipped.any()


def test_compare_leaves_weights_optimizer_and_rng_bit_identical():
    model = make_tiny_qwen2()
    actor = Actor(model, GRPOConfig(lr=1e-2))
    batch = stale_batch(model)
    actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)))  # so Adam has moments to disturb
    weights = copy.deepcopy(model.state_dict())
    optimizer = copy.deepcopy(actor.optimizer.state_dict())
    random.seed(7)
    torch.manual_seed(7)
    rng = (random.getstate(), torch.get_rng_state())
    results = compare_variants(
        actor,
        TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)),
        variant_configs(actor.cfg, VARIANTS),
        trial_step=True,
    )
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    after = actor.optimizer.state_dict()
    for i, moments in optimizer["state"].items():
        assert all(torch.equal(v, after["state"][i][k]) for k, v in moments.items())
    assert all(p.grad is None for p in actor.params)
    assert random.getstate() == rng[0] and torch.equal(torch.get_rng_state(), rng[1])
    assert (actor.version, actor.steps_done) == (1, 1)
    # the trial step: a real update of a copy, its KL on the batch positive and finite
    assert all(r.trial_kl is not None and 0 < r.trial_kl < 10 for r in results)


def test_cosines_and_table():
    model = make_tiny_qwen2()
    actor = Actor(model, GRPOConfig())
    batch = stale_batch(model)
    results = compare_variants(
        actor,
        TrainBatch(**batch, group_ids=torch.as_tensor(GROUPS)),
        variant_configs(actor.cfg, {"a": {}, "b": {"lr": 1.0}, "rloo": {}}),
    )
    cos = cosine_matrix(results)
    assert cos[0, 1] == pytest.approx(1.0, abs=1e-6)  # the learning rate does not change the gradient
    g0, g2 = results[0].grad.double(), results[2].grad.double()
    assert cos[0, 2] == pytest.approx(float(g0 @ g2 / (g0.norm() * g2.norm())), abs=1e-6)
    comparison = Comparison(
        {r.name: r for r in results},
        batch["input_ids"],
        batch["attention_mask"].bool(),
        batch["loss_mask"].bool(),
        batch["rewards"],
    )
    table = comparison.table
    assert list(table.index) == ["a", "b", "rloo"]
    assert table.loc["a", "loss"] == results[0].loss and table.loc["rloo", "cos_a"] == pytest.approx(
        float(cos[2, 0])
    )
    assert {"clipped_frac", "masked_frac", "grad_norm"} <= set(table.columns)


def test_token_weight_is_the_push_on_each_token():
    model = make_tiny_qwen2()
    actor = Actor(model, GRPOConfig())
    batch = make_batch(model, rewards=(1.0, 0.0, 1.0, 0.0))  # on-policy: ratio 1, nothing clipped
    (r,) = compare_variants(
        actor, TrainBatch(**batch, group_ids=torch.tensor([0, 0, 0, 0])), {"grpo": GRPOConfig()}
    )
    mask = batch["loss_mask"].bool()
    # token mean of −A·r at r = 1: ∂loss/∂log π_t = −A_t / N
    assert torch.allclose(r.token_weight[mask], r.advantages[mask] / int(mask.sum()), atol=1e-7)


def test_bad_variants_are_refused_by_name():
    base = GRPOConfig()
    with pytest.raises(ValueError, match="variant 'x'.*unknown actor knob"):
        variant_configs(base, {"x": {"eps": 1}})
    with pytest.raises(ValueError, match=r"(?s)variant 'y': .*algorithm\n  Input should be 'grpo'"):
        variant_configs(base, {"y": {"algorithm": "ppo9"}})
    with pytest.raises(ValueError, match="non-empty dict"):
        variant_configs(base, {})

"""Skipping the no-grad log-prob recomputation (`cfg.skip_redundant_recompute`): with one minibatch
the training forward runs the pre-update weights, so its detached log-probs are π_prox; the loss,
stats and update equal the recomputing path's, on- and off-policy, on real LocalEngine samples."""

import copy

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig

from .conftest import make_tiny_qwen2
from .test_engine_roundtrip import rollout

# The two paths run the same forward on the same weights (one with autograd recording): equal
# to float rounding. The engine's own record agrees with either to ~1e-6 (checked below).
TOL = 1e-6


@pytest.fixture(scope="module")
def engine_batch():
    from areal_nb.engine import LocalEngine

    model = make_tiny_qwen2()
    engine = LocalEngine(model, device="cpu", seed=0)
    try:
        batch, group_ids = rollout(engine, n_samples=4, temperature=1.0)
    finally:
        engine.close()
    return model, batch, group_ids


def step(model, batch, group_ids, **cfg_kwargs):
    """One train step of a copy of `model`: stats and the update (Adam, the real optimizer)."""
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, GRPOConfig(lr=1e-2, **cfg_kwargs))
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
    return stats, [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]


def assert_same_step(a, b, keys):
    (stats_a, update_a), (stats_b, update_b) = a, b
    for key in keys:
        assert stats_a[key] == pytest.approx(stats_b[key], abs=TOL), key
    assert max(float((x - y).abs().max()) for x, y in zip(update_a, update_b, strict=True)) < TOL
    assert max(float(x.abs().max()) for x in update_a) > 1e-3  # the step moved the weights


KEYS = (
    "loss",
    "grad_norm",
    "importance_weight_mean",
    "importance_weight_max",
    "clip_frac",
    "logprob_abs_diff_max",
    "entropy",
)


@pytest.mark.parametrize("decoupled", [True, False], ids=["decoupled", "plain"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_skipping_gives_the_recomputing_step_on_policy(engine_batch, decoupled, pack):
    model, batch, group_ids = engine_batch
    skipped = step(model, batch, group_ids, use_decoupled_loss=decoupled, pack=pack)
    recomputed = step(
        model, batch, group_ids, use_decoupled_loss=decoupled, pack=pack, skip_redundant_recompute=False
    )
    assert skipped[0]["recompute_skipped"] == 1.0 and recomputed[0]["recompute_skipped"] == 0.0
    # the engine's record equals the teacher-forced pass of the same weights
    assert skipped[0]["logprob_abs_diff_max"] < 1e-5
    assert_same_step(skipped, recomputed, KEYS + (("behave_imp_weight_mean",) if decoupled else ()))


def test_skipping_stays_exact_off_policy(engine_batch):
    """Tokens the engine sampled with other weights: π_prox still comes from the current weights,
    so the behaviour weights (and masking by their cap) are those of the recomputing path."""
    model, batch, group_ids = engine_batch
    batch = dict(batch)
    gen = batch["loss_mask"].bool()
    batch["logprobs"] = torch.where(gen, batch["logprobs"] - 0.2 * (batch["input_ids"] % 3), 0.0)
    batch["versions"] = torch.where(gen, -5, -1)  # whatever the version: the rule does not read it
    kw = {"use_decoupled_loss": True, "behave_imp_weight_cap": 1.3}
    skipped = step(model, batch, group_ids, **kw)
    recomputed = step(model, batch, group_ids, **kw, skip_redundant_recompute=False)
    assert skipped[0]["recompute_skipped"] == 1.0
    assert 0 < skipped[0]["behave_masked_frac"] < 1 and skipped[0]["behave_imp_weight_max"] > 1.3
    assert_same_step(
        skipped, recomputed, KEYS + ("behave_imp_weight_mean", "behave_masked_frac", "logprob_abs_diff_mean")
    )


@pytest.mark.parametrize(
    "cfg_kwargs",
    [
        {"ppo_n_minibatches": 2},  # the second minibatch runs updated weights: π_prox is recomputed
        {"kl_ctl": 0.1},  # plain PPO with a KL penalty needs π_old before the forward
        {"skip_redundant_recompute": False},
    ],
)
def test_recomputation_kept_where_it_can_differ(engine_batch, cfg_kwargs):
    model, batch, group_ids = engine_batch
    actor = Actor(copy.deepcopy(model), GRPOConfig(**cfg_kwargs), ref_model=copy.deepcopy(model))
    assert (
        actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))["recompute_skipped"]
        == 0.0
    )

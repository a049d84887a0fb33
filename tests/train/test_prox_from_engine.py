"""The engine's record as π_prox (`train.engine_numerics`): where the embedded engine sampled every
token with the trainer's current weights, in its dtype, on its device type, at its temperature,
the no-grad recomputation is not run and the step equals the recomputing one to 1e-6 (loss,
stats, gradients, update), on real LocalEngine samples; wherever one condition fails, it runs.
Where the training forward computes π_prox anyway (one minibatch), that exact value is kept.
`skip_redundant_recompute=False` forces the recomputation."""

import copy

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.engine_numerics import EngineNumerics

from .conftest import make_tiny_qwen2
from .test_engine_roundtrip import rollout

TOL = 1e-6
EXACT = EngineNumerics(dtype=torch.float32, device="cpu", temperature=1.0)


@pytest.fixture(scope="module")
def engine_batch():
    from areal_nb.engine import LocalEngine

    model = make_tiny_qwen2()
    engine = LocalEngine(model, device="cpu", seed=0)
    try:
        batch, group_ids = rollout(engine, n_samples=4, temperature=1.0)
    finally:
        engine.close()
    assert (batch["versions"][batch["loss_mask"].bool()] == 0).all()
    return model, batch, group_ids


def step(model, batch, group_ids, numerics, version=0, compute_dtype=None, **cfg_kwargs):
    """One train step of a copy of `model`: (stats, gradients of each optimizer step, update,
    forwards run)."""
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    grads: list[list[torch.Tensor]] = []
    actor = Actor(
        model,
        GRPOConfig(lr=1e-2, **cfg_kwargs),
        version=version,
        compute_dtype=compute_dtype,
        engine_numerics=numerics,
    )
    forwards = []
    model.get_input_embeddings().register_forward_hook(lambda *_: forwards.append(1))
    step_grads = actor.optimizer.step

    def record_then_step(*args, **kwargs):
        grads.append([p.grad.detach().clone() for p in actor.params])
        return step_grads(*args, **kwargs)

    actor.optimizer.step = record_then_step
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
    update = [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
    return stats, grads, update, len(forwards)


KEYS = ("loss", "grad_norm", "importance_weight_mean", "importance_weight_max", "clip_frac", "entropy")


@pytest.mark.parametrize(
    "cfg_kwargs",
    [
        {"use_decoupled_loss": True},
        {"use_decoupled_loss": True, "ppo_n_minibatches": 2},  # where the old rule recomputes too
        {"use_decoupled_loss": False, "ppo_n_minibatches": 2},  # π_old of the plain ratio
    ],
    ids=["decoupled", "decoupled-2-minibatches", "plain-2-minibatches"],
)
def test_the_record_replaces_the_recomputation_to_1e6(engine_batch, cfg_kwargs):
    model, batch, group_ids = engine_batch
    used = step(model, batch, group_ids, EXACT, **cfg_kwargs)
    forced = step(model, batch, group_ids, EXACT, skip_redundant_recompute=False, **cfg_kwargs)
    minibatches = cfg_kwargs.get("ppo_n_minibatches", 1)
    assert forced[0]["prox_from_engine"] == forced[0]["recompute_skipped"] == 0.0  # the knob forces it
    assert forced[0]["logprob_abs_diff_max"] < 1e-5  # the engine's record is the recomputation
    if minibatches == 1:  # the training forward computes π_prox exactly: it is kept, drift check too
        assert used[0]["prox_from_engine"] == 0.0 and used[0]["recompute_skipped"] == 1.0
        assert "logprob_abs_diff_max" in used[0]
    else:
        assert used[0]["prox_from_engine"] == 1.0
        assert "logprob_abs_diff_max" not in used[0]  # nothing was recomputed to compare with
    assert used[3] < forced[3]  # the training forwards only: no recomputation before the update
    keys = KEYS + (("behave_imp_weight_mean",) if cfg_kwargs["use_decoupled_loss"] else ())
    for key in keys:
        assert used[0][key] == pytest.approx(forced[0][key], abs=TOL), key
    assert len(used[1]) == len(forced[1]) == minibatches
    for grads_used, grads_forced in zip(used[1], forced[1], strict=True):
        assert max(float((a - b).abs().max()) for a, b in zip(grads_used, grads_forced, strict=True)) < TOL
    # (Adam divides each gradient by its own magnitude: where one is ~1e-7 a 1e-7 difference moves
    # that weight's update by more than 1e-6 of lr; the gradients themselves are the criterion)
    assert max(float((a - b).abs().max()) for a, b in zip(used[2], forced[2], strict=True)) < 1e-3 * 1e-2
    assert max(float(a.abs().max()) for a in used[2]) > 1e-3  # the step moved the weights


@pytest.mark.parametrize(
    "case",
    [
        {"version": 1},  # sampled one version ago
        {"numerics": EngineNumerics(torch.bfloat16, "cpu", 1.0)},  # the engine serves bf16
        {"compute_dtype": torch.bfloat16},  # the trainer computes under autocast
        {"numerics": EngineNumerics(torch.float32, "cuda", 1.0)},  # another device's kernels
        {"numerics": EngineNumerics(torch.float32, "cpu", 0.7)},  # another temperature
        {"numerics": None},  # an engine that says nothing (servers, LoRA)
    ],
    ids=["stale", "engine-bf16", "trainer-autocast", "other-device", "other-temperature", "unknown"],
)
def test_the_recomputation_runs_where_the_record_is_not_the_current_policy(engine_batch, case):
    model, batch, group_ids = engine_batch
    case = {"numerics": EXACT, **case}
    stats, _, _, forwards = step(
        model,
        batch,
        group_ids,
        case["numerics"],
        version=case.get("version", 0),
        compute_dtype=case.get("compute_dtype"),
        use_decoupled_loss=True,
        ppo_n_minibatches=2,
    )
    assert stats["prox_from_engine"] == 0.0
    assert "logprob_abs_diff_max" in stats  # π_prox was recomputed and compared with the record
    exact = step(model, batch, group_ids, EXACT, use_decoupled_loss=True, ppo_n_minibatches=2)
    assert forwards > exact[3]  # the recomputation's forwards ran


def test_one_stale_token_is_enough_to_recompute(engine_batch):
    model, batch, group_ids = engine_batch
    batch = dict(batch)
    gen = batch["loss_mask"].bool()
    batch["versions"] = torch.where(gen, 1, -1)  # as if sampled after one update ...
    kwargs = {"version": 1, "use_decoupled_loss": True, "ppo_n_minibatches": 2}
    assert step(model, batch, group_ids, EXACT, **kwargs)[0]["prox_from_engine"] == 1.0
    last = tuple(gen.nonzero()[-1])
    batch["versions"][last] = 0  # ... but for one token, sampled before it
    assert step(model, batch, group_ids, EXACT, **kwargs)[0]["prox_from_engine"] == 0.0

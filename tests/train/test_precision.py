"""Mixed precision: a bfloat16 policy trains float32 master weights, computes in bfloat16, and
serves bfloat16 weights to the engine."""

import copy

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig

from .conftest import make_tiny_qwen2
from .test_actor import make_batch


def relative_update(actor: Actor, before: dict[str, torch.Tensor]) -> float:
    """‖W_after − W_before‖ / ‖W_before‖ over all weights, in float64."""
    after = actor.weights()
    moved = sum(float((after[k].double() - v.double()).square().sum()) for k, v in before.items())
    size = sum(float(v.double().square().sum()) for v in before.values())
    return (moved / size) ** 0.5


def train(model: torch.nn.Module, batch: dict, steps: int = 3, **cfg) -> Actor:
    actor = Actor(model, GRPOConfig(lr=1e-6, **cfg))
    for _ in range(steps):
        actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 1, 1])))
    return actor


def test_bf16_policy_moves_its_weights_like_fp32_at_a_small_learning_rate():
    # At lr 1e-6 an AdamW update (~1e-6 per weight) is below half a bfloat16 step of a weight of
    # ~0.02 (~4e-5): updating bf16 parameters in place rounds almost all of it away.
    fp32 = make_tiny_qwen2()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    batch = make_batch(fp32)
    before = {k: v.float().clone() for k, v in bf16.state_dict().items()}
    before_fp32 = {k: v.clone() for k, v in fp32.state_dict().items()}
    fp32_update = relative_update(train(fp32, batch), before_fp32)
    bf16_actor = train(bf16, batch)
    bf16_update = relative_update(bf16_actor, before)
    assert fp32_update > 0
    assert bf16_update >= 0.9 * fp32_update, (bf16_update, fp32_update)
    # the master weights and Adam's moments are float32; the compute dtype stays bfloat16
    assert bf16_actor.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in bf16_actor.params)
    moments = [t for s in bf16_actor.optimizer.state.values() for t in s.values() if t.dim() > 0]
    assert moments and all(t.dtype == torch.float32 for t in moments)


def test_the_forward_computes_in_the_compute_dtype():
    model = make_tiny_qwen2().to(torch.bfloat16)
    actor = Actor(model, GRPOConfig())
    seen = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    actor.train_step(TrainBatch(**make_batch(make_tiny_qwen2()), group_ids=torch.as_tensor([0, 0, 1, 1])))
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}


class RecordingEngine:
    def __init__(self):
        self.pushed = None

    def update_weights(self, weights, version=None):
        self.pushed = weights


def test_the_engine_receives_weights_in_the_compute_dtype():
    model = make_tiny_qwen2().to(torch.bfloat16)
    actor = Actor(model, GRPOConfig(lr=1e-6))
    actor.train_step(TrainBatch(**make_batch(make_tiny_qwen2()), group_ids=torch.as_tensor([0, 0, 1, 1])))
    engine = RecordingEngine()
    actor.push_weights(engine)
    masters = actor.weights()
    assert set(engine.pushed) == set(masters)
    for name, value in engine.pushed.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, masters[name].to(torch.bfloat16))


def test_an_explicit_compute_dtype_and_the_kl_reference():
    model, ref = make_tiny_qwen2(), make_tiny_qwen2()
    actor = Actor(model, GRPOConfig(kl_ctl=0.1), ref_model=ref, compute_dtype=torch.bfloat16)
    stats = actor.train_step(
        TrainBatch(**make_batch(make_tiny_qwen2()), group_ids=torch.as_tensor([0, 0, 1, 1]))
    )
    assert actor.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in ref.parameters())  # no grads: kept in the compute dtype
    assert stats["kl_ref"] == pytest.approx(0.0, abs=0.05)


def test_float16_scales_the_loss_and_moves_the_weights_like_fp32():
    fp32 = make_tiny_qwen2()
    fp16 = copy.deepcopy(fp32).to(torch.float16)
    batch = make_batch(fp32)
    before = {k: v.float().clone() for k, v in fp16.state_dict().items()}
    before_fp32 = {k: v.clone() for k, v in fp32.state_dict().items()}
    fp32_update = relative_update(train(fp32, batch), before_fp32)
    actor = train(fp16, batch)
    assert actor.grad_scaler is not None and actor.grad_scaler.get_scale() > 1
    assert relative_update(actor, before) >= 0.9 * fp32_update

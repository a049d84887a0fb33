"""A LoRA policy served in place (`engine/in_place_lora.py`): the embedded engine shares the
trainer's frozen base and reads its adapter tensors themselves, with no merged copy; a push is a
version change. Its records must be the trainer's base + adapter (recomputed log-probs within
float32 noise before and after pushes), in the lean forward and the stock one, and each token
must carry the version that sampled it while generations run across train steps."""

from __future__ import annotations

import pytest
import torch

from areal_nb.api import InPlaceAdapters, LowRankAdapter
from areal_nb.engine import LocalEngine
from areal_nb.errors import InvalidArgumentError, WeightUpdateError
from areal_nb.train import Actor, GRPOConfig, TrainBatch
from areal_nb.train.lora import LoraConfig, adapts_linear_layers_only, in_place_adapters, merged_weights

from ..train.conftest import make_tiny_qwen2
from ..train.test_engine_roundtrip import rollout
from .test_shared_weights import train_while_generating

pytestmark = pytest.mark.slow

PARTIAL = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "up_proj"])  # fused groups in part
ALL_LINEAR = LoraConfig(r=4, alpha=8.0, target_modules="all-linear")


def served_lora(lora: LoraConfig, fast_forward: bool = True, lr: float = 5e-2, temperature: float = 0.8):
    model = make_tiny_qwen2()
    engine = LocalEngine(model, device="cpu", seed=0, share_weights=True, fast_forward=fast_forward)
    actor = Actor(model, GRPOConfig(lr=lr, lora=lora), version=0, temperature=temperature)
    actor.serve_in_place(engine)
    return engine, actor


def test_the_engine_serves_the_trainers_base_and_adapters_and_a_push_copies_nothing():
    engine, actor = served_lora(ALL_LINEAR)
    try:
        assert engine.shares_weights and actor.in_place_engine is engine
        base = {n.replace(".base_layer", ""): p for n, p in actor.model.get_base_model().named_parameters()}
        served = dict(engine.model.named_parameters())
        assert served.keys() <= base.keys() and all(served[k] is base[k] for k in served)
        before = {k: v.data_ptr() for k, v in engine.model.state_dict().items()}
        assert actor.push_weights(engine, 5) == 5 and engine.get_version() == 5
        assert {k: v.data_ptr() for k, v in engine.model.state_dict().items()} == before
        adapters = in_place_adapters(actor.model).modules
        assert len(adapters) == 2 * 7  # two layers, every linear layer
        trained = {p for n, p in actor.model.named_parameters() if p.requires_grad}
        assert {id(t) for a in adapters.values() for t in (a.a, a.b)} == {id(p) for p in trained}
        rollout(engine, temperature=0.8)
        layers = engine._batch.fast._layers
        engine.drop_caches()  # (before a train step) the frozen base's lean copies stay valid: kept
        assert layers is not None and engine._batch.fast._layers is layers and len(engine.prefix_cache) == 0
    finally:
        engine.close()


@pytest.mark.parametrize("lora", [PARTIAL, ALL_LINEAR], ids=["partial", "all-linear"])
@pytest.mark.parametrize("fast_forward", [True, False], ids=["lean", "stock"])
def test_recorded_logprobs_are_the_trainers_before_and_after_pushes(lora, fast_forward):
    engine, actor = served_lora(lora, fast_forward)
    try:
        assert (engine._batch.fast is not None) == fast_forward
        for step in range(3):
            batch, group_ids = rollout(engine, temperature=0.8)
            assert (batch["versions"][batch["loss_mask"].bool()] == step).all()
            stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
            assert stats["logprob_abs_diff_max"] < 1e-4, step  # engine's record vs base + adapter
            assert engine.get_version() == actor.version == step + 1 and not engine.paused
        # the adapters moved the policy: serving the base alone would not match
        base = make_tiny_qwen2().state_dict()
        assert max((v - base[k]).abs().max().item() for k, v in merged_weights(actor.model).items()) > 1e-2
    finally:
        engine.close()


@pytest.mark.parametrize("fast_forward", [True, False], ids=["lean", "stock"])
def test_concurrent_generations_across_steps_carry_the_version_that_sampled_each_token(fast_forward):
    engine, actor = served_lora(ALL_LINEAR, fast_forward, lr=3e-2, temperature=0.8)
    # the replay runs base + ΔW merged, as the trainer computes it, on a plain copy of the model
    train_while_generating(engine, actor, lambda: merged_weights(actor.model), make_tiny_qwen2(), 0.8)


def test_adapters_in_place_are_refused_where_they_cannot_be_served():
    model = make_tiny_qwen2()
    q = model.model.layers[0].self_attn.q_proj
    good = LowRankAdapter(torch.zeros(2, q.in_features), torch.zeros(q.out_features, 2), 1.0)
    with LocalEngine(model, device="cpu") as engine:  # its own copy: merged weights only
        with pytest.raises(WeightUpdateError, match="share_weights=True"):
            engine.update_weights(InPlaceAdapters({"model.layers.0.self_attn.q_proj": good}))
    with LocalEngine(model, device="cpu", share_weights=True) as engine:
        for modules, match in [
            ({"model.layers.0.input_layernorm": good}, "not a linear module"),
            ({"model.layers.0.self_attn.q_proj": LowRankAdapter(good.b, good.a, 1.0)}, "its adapter has"),
            (
                {"model.layers.0.self_attn.q_proj": LowRankAdapter(good.a.double(), good.b.double(), 1.0)},
                "must be torch.float32",
            ),
        ]:
            with pytest.raises(WeightUpdateError, match=match):
                engine.update_weights(InPlaceAdapters(modules), version=1)
        assert engine.get_version() == 0
        engine.update_weights(InPlaceAdapters({"model.layers.0.self_attn.q_proj": good}), version=1)
        assert engine.get_version() == 1
    embeddings = LoraConfig(r=2, target_modules=["embed_tokens", "q_proj"])
    assert not adapts_linear_layers_only(make_tiny_qwen2(), embeddings)
    assert adapts_linear_layers_only(make_tiny_qwen2(), PARTIAL)
    actor = Actor(make_tiny_qwen2(), GRPOConfig(lora=embeddings))
    with LocalEngine(make_tiny_qwen2(), device="cpu", share_weights=True) as engine:
        with pytest.raises(InvalidArgumentError, match="linear layers only"):
            actor.serve_in_place(engine)
        assert actor.in_place_engine is None

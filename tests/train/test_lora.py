"""`actor.lora` on a real (tiny, random) Qwen2: only the adapters train, the KL reference is the
base with the adapters off, the packed fast paths apply the adapters, the engine samples with the
merged weights, and adapters / merged models round trip through peft and transformers."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from areal_nb.api.train_batch import TrainBatch
from areal_nb.engine import LocalEngine
from areal_nb.session.hf_export import write_adapter_folder, write_model_folder
from areal_nb.train import Actor, GRPOConfig, compute_token_logprobs
from areal_nb.train.head_forward import supports_head_forward
from areal_nb.train.lora import LoraConfig, lora_base, merged_weights
from areal_nb.train.tree_attention import supports_tree_attention

from .conftest import make_tiny_qwen2
from .test_actor import make_batch
from .test_engine_roundtrip import rollout

LORA = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "up_proj"])
GROUP = [0, 0, 0, 0]


def lora_actor(**kw) -> Actor:
    return Actor(make_tiny_qwen2(), GRPOConfig(lr=kw.pop("lr", 1e-2), lora=kw.pop("lora", LORA), **kw))


def test_only_the_adapter_trains_and_holds_optimizer_state():
    base = {k: v.clone() for k, v in make_tiny_qwen2().state_dict().items()}
    actor = lora_actor()
    trainable = {n: p for n, p in actor.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in trainable.items()}
    stats = actor.train_step(
        TrainBatch(**make_batch(lora_base(actor.model)), group_ids=torch.as_tensor(GROUP))
    )
    assert stats["logprob_abs_diff_max"] < 1e-5  # B starts at 0: the adapted model is the base
    # every adapter's B moved (A gets no gradient while B is 0); no base weight did
    assert all(not torch.equal(p, before[n]) for n, p in trainable.items() if ".lora_B." in n)
    for name, value in actor.model.get_base_model().state_dict().items():
        if "lora_" not in name:
            assert torch.equal(value, base[name.replace(".base_layer", "")]), name
    # AdamW's moments: adapter-sized
    moments = [s["exp_avg"].numel() for s in actor.optimizer.state.values()]
    assert (
        sum(moments)
        == sum(p.numel() for p in trainable.values())
        < sum(v.numel() for v in base.values()) / 10
    )
    # the merged weights differ from the base exactly in the adapted layers
    merged = merged_weights(actor.model)
    assert merged.keys() == base.keys()
    changed = {k for k in base if not torch.equal(merged[k], base[k])}
    assert changed and all(k.split(".")[-2] in LORA.target_modules for k in changed)


def test_kl_reference_is_the_base_with_the_adapter_off():
    actor = lora_actor(kl_ctl=0.1)
    assert actor.ref_model is None  # no second copy
    policy = lora_base(actor.model)
    assert actor.train_step(TrainBatch(**make_batch(policy), group_ids=torch.as_tensor(GROUP)))[
        "kl_ref"
    ] == pytest.approx(0.0, abs=1e-6)
    batch = make_batch(policy)  # on-policy for the trained adapter
    mask = batch["loss_mask"].bool()
    with torch.no_grad():
        ours = compute_token_logprobs(policy, batch["input_ids"], batch["attention_mask"])[mask]
        ref = compute_token_logprobs(make_tiny_qwen2(), batch["input_ids"], batch["attention_mask"])[mask]
    expected = float((ours - ref).clamp(-10, 10).mean())
    assert abs(expected) > 1e-4  # the adapter moved the policy: the check below can fail
    assert actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))["kl_ref"] == pytest.approx(
        expected, rel=1e-4
    )


def test_packed_fast_paths_apply_the_adapter():
    """Tree attention with the last layer at the heads walks the base's layers: the same two
    steps as the padded rows (the second runs a non-zero adapter)."""
    fast, padded = lora_actor(lr=5e-2), lora_actor(lr=5e-2, pack=False)
    assert supports_tree_attention(lora_base(fast.model)) and supports_head_forward(lora_base(fast.model))
    batch = make_batch(make_tiny_qwen2())
    for _ in range(2):
        fast.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))
        padded.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))
    a, b = merged_weights(fast.model), merged_weights(padded.model)
    assert any(not torch.equal(a[k], make_tiny_qwen2().state_dict()[k]) for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0)


def test_gradient_checkpointing_with_lora_trains_the_same():
    plain, checkpointed = lora_actor(), lora_actor(gradient_checkpointing=True)
    batch = make_batch(make_tiny_qwen2())
    for _ in range(2):
        plain.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))
        checkpointed.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))
    a, b = merged_weights(plain.model), merged_weights(checkpointed.model)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)


def test_engine_logprobs_equal_the_trainers_after_an_adapter_push():
    engine = LocalEngine(make_tiny_qwen2(), device="cpu", seed=0)
    try:
        actor = Actor(
            make_tiny_qwen2(), GRPOConfig(lr=5e-2, lora=LORA), version=engine.get_version(), temperature=0.8
        )
        for step in range(3):
            batch, group_ids = rollout(engine, temperature=0.8)
            stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
            assert stats["logprob_abs_diff_max"] < 1e-4, step  # engine's record vs base + adapter
            assert actor.push_weights(engine) == step + 1
        base = make_tiny_qwen2().state_dict()
        assert any(not torch.equal(v, base[k]) for k, v in merged_weights(actor.model).items())
    finally:
        engine.close()


def test_adapter_and_merged_folders_round_trip(tmp_path):
    actor = lora_actor(lr=5e-2)
    batch = make_batch(make_tiny_qwen2())
    for _ in range(2):
        actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))
    ids, attention = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        ours = lora_base(actor.model)(input_ids=ids, attention_mask=attention).logits
        base = make_tiny_qwen2()(input_ids=ids, attention_mask=attention).logits
    assert (ours - base).abs().max() > 1e-3
    write_adapter_folder(actor.model, None, tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "model.safetensors").exists()  # the adapter only
    loaded = PeftModel.from_pretrained(make_tiny_qwen2(), tmp_path / "adapter").eval()
    write_model_folder(actor.model, actor.weights(), None, torch.float32, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids, attention_mask=attention).logits, ours, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            merged(input_ids=ids, attention_mask=attention).logits, ours, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"r": 0}, "lora.r"),
        ({"alpha": 0}, "lora.alpha"),
        ({"target_modules": []}, "target_modules"),
        ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"),
    ],
)
def test_bad_lora_config_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        LoraConfig(**kw)


def test_lora_refuses_a_separate_reference_model():
    with pytest.raises(ValueError, match="adapters off"):
        Actor(make_tiny_qwen2(), GRPOConfig(lora=LORA, kl_ctl=0.1), ref_model=make_tiny_qwen2())


def test_session_config_reads_actor_lora_and_names_a_bad_value():
    from pathlib import Path

    from areal_nb.config import ConfigError, load_config

    yaml = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
    cfg = load_config(yaml, ["actor.lora={r: 4, target_modules: [q_proj]}"])
    assert cfg.actor.lora == LoraConfig(r=4, target_modules=["q_proj"])
    assert load_config(yaml).actor.lora is None
    with pytest.raises(ConfigError, match=r"actor\.lora.*lora\.r must be >= 1"):
        load_config(yaml, ["actor.lora={r: 0}"])


def test_the_lab_compares_variants_of_a_lora_actor_without_changing_it():
    from areal_nb.session.lab import variant_configs
    from areal_nb.train.lab import compare_variants

    actor = lora_actor()
    batch = make_batch(make_tiny_qwen2())
    actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)))  # a non-zero adapter
    before = {k: v.clone() for k, v in actor.model.state_dict().items()}
    results = compare_variants(
        actor,
        TrainBatch(**batch, group_ids=torch.as_tensor(GROUP)),
        variant_configs(actor.cfg, {"grpo": {}, "dr_grpo": {}}),
        trial_step=True,
    )
    adapter_size = sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
    assert all(r.grad.numel() == adapter_size for r in results)  # the adapters' gradients only
    assert all(torch.equal(v, before[k]) for k, v in actor.model.state_dict().items())

"""Actor.train_step on a real (tiny, random) Qwen2: direction of the update, exactness of
micro-batching, on-policy ratios, decoupled weights, staleness, checkpoints, errors."""

import copy
import math

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig, compute_token_logprobs

from .conftest import make_tiny_qwen2

PROMPT = [2, 3, 4]
COMPLETIONS = [[10, 11, 12, 1], [20, 21, 1], [30, 31, 32, 33, 1], [40, 1]]


def make_batch(model, completions=COMPLETIONS, rewards=(1.0, 0.0, 1.0, 0.0), versions=None):
    """The capture layer's layout, with on-policy engine log-probs from `model`."""
    rows = [PROMPT + c for c in completions]
    width = max(map(len, rows))
    pad = lambda r, v: r + [v] * (width - len(r))  # noqa: E731
    input_ids = torch.tensor([pad(r, 0) for r in rows])
    attention = torch.tensor([pad([1] * len(r), 0) for r in rows], dtype=torch.bool)
    loss_mask = torch.tensor([pad([0] * len(PROMPT) + [1] * len(c), 0) for c in completions])
    with torch.no_grad():
        logprobs = compute_token_logprobs(model, input_ids, attention) * loss_mask
    if versions is None:
        versions = [0] * len(rows)
    version_rows = torch.tensor(
        [pad([-1] * len(PROMPT) + [v] * len(c), -1) for c, v in zip(completions, versions, strict=True)]
    )
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "versions": version_rows,
        "turn_ids": loss_mask.clone(),
        "rewards": torch.tensor(rewards),
    }


def generated_logprobs(model, batch):
    with torch.no_grad():
        logp = compute_token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    return [logp[i][batch["loss_mask"][i].bool()] for i in range(len(logp))]


def test_step_raises_positive_and_lowers_negative_advantage_tokens(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    before = generated_logprobs(tiny_qwen2, batch)
    actor = Actor(tiny_qwen2, GRPOConfig(lr=1e-3))
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])))
    after = generated_logprobs(tiny_qwen2, batch)
    # group of 4 with rewards 1, 0, 1, 0: scores ±0.5/std, unbiased std = sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-5)
    assert stats["adv_max"] == pytest.approx(a, rel=1e-5) and stats["adv_min"] == pytest.approx(-a, rel=1e-5)
    for row, sign in zip(range(4), (+1, -1, +1, -1), strict=True):
        change = after[row] - before[row]
        assert (sign * change > 0).all(), (row, change)
    assert stats["reward_mean"] == 0.5 and stats["reward_std"] == 0.5
    assert stats["n_tokens"] == 14.0
    assert actor.version == 1 and stats["version"] == 0.0


def test_on_policy_ratios_start_at_one(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    stats = Actor(tiny_qwen2, GRPOConfig()).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 1, 1]))
    )
    assert stats["logprob_abs_diff_max"] < 1e-6
    assert stats["importance_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["importance_weight_max"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clip_frac"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-9)
    assert stats["entropy"] > 0


def test_micro_batches_give_the_same_update_as_one_forward():
    whole, split = make_tiny_qwen2(), make_tiny_qwen2()
    batch = make_batch(whole)
    # adam_eps=1 makes the first AdamW step ~ lr * grad: with the default eps, a gradient entry
    # near zero becomes ±lr on float-summation noise, which would hide what this test compares.
    s1 = Actor(whole, GRPOConfig(lr=1e-3, adam_eps=1.0)).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    s2 = Actor(split, GRPOConfig(lr=1e-3, adam_eps=1.0, micro_batch_size=1)).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5)
    for (name, p), q in zip(whole.named_parameters(), split.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def test_minibatches_make_one_optimizer_step_each(tiny_qwen2):
    actor = Actor(tiny_qwen2, GRPOConfig(ppo_n_minibatches=2))
    stats = actor.train_step(TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0])))
    steps = {int(s["step"]) for s in actor.optimizer.state_dict()["state"].values()}
    assert steps == {2}
    # the second minibatch is trained by updated weights: its ratios are no longer all 1
    assert stats["importance_weight_max"] > 1.0 or stats["importance_weight_min"] < 1.0
    with pytest.raises(ValueError, match="fewer than ppo_n_minibatches"):
        Actor(tiny_qwen2, GRPOConfig(ppo_n_minibatches=5)).train_step(
            TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0]))
        )


def test_decoupled_loss_reports_behaviour_weights(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    batch["logprobs"] = batch["logprobs"] - 0.1 * batch["loss_mask"]  # engine was a bit less sure
    cfg = GRPOConfig(use_decoupled_loss=True, behave_imp_weight_cap=5.0)
    stats = Actor(tiny_qwen2, cfg).train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])))
    assert stats["behave_imp_weight_mean"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert stats["behave_imp_weight_max"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert stats["behave_masked_frac"] == 0.0
    assert stats["logprob_abs_diff_mean"] == pytest.approx(0.1, abs=1e-6)
    # ratios are taken against the recomputed (proximal) policy, so they start at 1
    assert stats["importance_weight_mean"] == pytest.approx(1.0, abs=1e-6)


def test_staleness_from_versions():
    model = make_tiny_qwen2()
    batch = make_batch(model, versions=[3, 2, 1, 3])
    stats = Actor(model, GRPOConfig(), version=3).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    # tokens per row 4, 3, 5, 2 with lags 0, 1, 2, 0
    assert stats["staleness_max"] == 2.0
    assert stats["staleness_mean"] == pytest.approx((0 * 4 + 1 * 3 + 2 * 5 + 0 * 2) / 14)


def test_kl_to_reference_model(tiny_qwen2):
    batch = make_batch(tiny_qwen2)
    with pytest.raises(ValueError, match="ref_model"):
        Actor(tiny_qwen2, GRPOConfig(kl_ctl=0.1)).train_step(
            TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
        )
    ref = copy.deepcopy(tiny_qwen2)
    stats = Actor(tiny_qwen2, GRPOConfig(kl_ctl=0.1), ref_model=ref).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    # identical weights: KL 0, advantages are the plain group scores
    assert stats["adv_max"] == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-5), rel=1e-5)
    assert stats["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    # another reference: kl_ref is the k1 estimate log pi - log pi_ref, averaged over generated tokens
    other = make_tiny_qwen2(seed=1)
    policy = make_tiny_qwen2()
    expected = torch.cat(generated_logprobs(policy, batch)) - torch.cat(generated_logprobs(other, batch))
    stats = Actor(policy, GRPOConfig(kl_ctl=0.1), ref_model=other).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )
    assert stats["kl_ref"] == pytest.approx(float(expected.clamp(-10, 10).mean()), rel=1e-5)
    assert "kl_ref" not in Actor(make_tiny_qwen2(), GRPOConfig()).train_step(
        TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0]))
    )


class RecordingEngine:
    def __init__(self):
        self.updates = []

    def update_weights(self, weights, version=None):
        self.updates.append((weights, version))


def test_push_weights_and_checkpoint_round_trip(tiny_qwen2):
    actor = Actor(tiny_qwen2, GRPOConfig(), version=4)
    actor.train_step(TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0])))
    engine = RecordingEngine()
    assert actor.push_weights(engine) == 5
    weights, version = engine.updates[0]
    assert version == 5 and torch.equal(weights["lm_head.weight"], tiny_qwen2.lm_head.weight)

    state = copy.deepcopy(actor.state_dict())
    other = Actor(make_tiny_qwen2(seed=1), GRPOConfig())
    other.load_state_dict(state)
    assert other.version == 5
    for p, q in zip(tiny_qwen2.parameters(), other.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert other.optimizer.state_dict()["state"].keys() == actor.optimizer.state_dict()["state"].keys()
    assert other.steps_done == 1  # the learning-rate schedule resumes where it stopped


def test_learning_rate_schedules():
    assert [GRPOConfig(lr=1.0).lr_at(s) for s in (0, 5, 500)] == [1.0, 1.0, 1.0]
    linear = GRPOConfig(lr=1.0, lr_schedule="linear", lr_warmup_steps=1, lr_decay_steps=5, min_lr_ratio=0.2)
    # warm-up 1/2, then 1 → 0.2 over the 4 steps after it, then 0.2 for good
    assert [round(linear.lr_at(s), 6) for s in range(7)] == [0.5, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2]
    cosine = GRPOConfig(lr=2.0, lr_schedule="cosine", lr_decay_steps=4)
    assert [round(cosine.lr_at(s), 6) for s in range(5)] == [
        2.0,
        round(1 + math.sqrt(0.5), 6),
        1.0,
        round(1 - math.sqrt(0.5), 6),
        0.0,
    ]
    with pytest.raises(ValueError, match="needs lr_decay_steps"):
        GRPOConfig(lr_schedule="linear").lr_at(0)


def test_actor_steps_with_the_scheduled_learning_rate(tiny_qwen2, caplog):
    cfg = GRPOConfig(lr=1e-3, lr_schedule="linear", lr_decay_steps=2)
    actor = Actor(tiny_qwen2, cfg)
    lrs = [
        actor.train_step(TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0])))["lr"]
        for _ in range(3)
    ]
    assert lrs == [1e-3, 5e-4, 0.0]
    before = [p.detach().clone() for p in tiny_qwen2.parameters()]
    actor.train_step(
        TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0]))
    )  # lr 0: AdamW moves nothing
    assert all(torch.equal(p, q) for p, q in zip(before, tiny_qwen2.parameters(), strict=True))
    warnings = [r.getMessage() for r in caplog.records if "reached 0" in r.getMessage()]
    assert len(warnings) == 1 and "lr_decay_steps=2" in warnings[0]  # said once, not every step


def test_bad_batches_are_refused(tiny_qwen2):
    from areal_nb.errors import ArgumentTypeError, TrainBatchError

    actor = Actor(tiny_qwen2, GRPOConfig())
    batch = make_batch(tiny_qwen2)
    with pytest.raises(ArgumentTypeError, match="takes a TrainBatch"):
        actor.train_step(batch)  # the tensors by name: no longer the step's contract
    with pytest.raises(TypeError, match="logprobs"):
        TrainBatch(**{k: v for k, v in batch.items() if k != "logprobs"})
    with pytest.raises(ArgumentTypeError, match=r"TrainBatch.group_ids must be a torch.Tensor, got list"):
        TrainBatch(**batch, group_ids=[0, 0, 0, 0])
    left_padded = dict(batch, attention_mask=batch["attention_mask"].flip(1))
    with pytest.raises(TrainBatchError, match="right-padded"):
        TrainBatch(**left_padded)
    with pytest.raises(TrainBatchError, match="group_ids has 3 entries for 4 rows"):
        TrainBatch(**batch, group_ids=torch.tensor([0, 0, 1]))
    with pytest.raises(TrainBatchError, match=r"TrainBatch.versions has shape \(4, 7\)"):
        TrainBatch(**dict(batch, versions=batch["versions"][:, :-1]))
    with pytest.raises(TrainBatchError, match="rewards has 3 entries for 4 rows"):
        TrainBatch(**dict(batch, rewards=batch["rewards"][:3]))
    with pytest.raises(ValueError):  # TrainBatchError is a ValueError
        TrainBatch(**dict(batch, input_ids=batch["input_ids"][0]))
    assert TrainBatch(**batch).attention_mask.dtype == torch.bool


def test_the_session_actor_recomputes_log_probs_at_the_rollout_temperature():
    """One key: the trainer's temperature is derived from rollout.temperature, not set beside it."""
    from areal_nb.config import load_config
    from areal_nb.session.builder import build_actor

    actor = build_actor(load_config(None, ["rollout.temperature=0.7"]), make_tiny_qwen2())
    assert actor.temperature == 0.7
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Actor(make_tiny_qwen2(), GRPOConfig(), temperature=0.0)


def test_on_cpu_the_fused_adamw_takes_the_for_loop_adamw_step_up_to_float32_rounding(tiny_qwen2):
    """The Actor's AdamW on CPU is torch's fused kernel (one pass per parameter); on the same
    gradients its step moves the weights as the default for-loop implementation does, to float32
    rounding."""
    batch = TrainBatch(**make_batch(tiny_qwen2), group_ids=torch.as_tensor([0, 0, 0, 0]))
    fused = Actor(copy.deepcopy(tiny_qwen2), GRPOConfig(lr=1e-3))
    loop = Actor(copy.deepcopy(tiny_qwen2), GRPOConfig(lr=1e-3))
    assert fused.optimizer.defaults["fused"] is True
    cfg = loop.cfg  # the default implementation (on CPU: the for-loop), same hyperparameters
    loop.optimizer = torch.optim.AdamW(
        loop.params, lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    stats = [actor.train_step(batch) for actor in (fused, loop)]
    assert stats[0]["loss"] == stats[1]["loss"] and stats[0]["grad_norm"] == stats[1]["grad_norm"]
    moved = [(a - b).abs().max() for a, b in zip(fused.params, tiny_qwen2.parameters(), strict=True)]
    assert max(moved) > 1e-4  # (the steps moved the weights)
    for a, b in zip(fused.params, loop.params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)

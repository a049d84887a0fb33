"""Per-turn credit: `credit="leaf"` follows AReaL's rule, checked against that rule written out
independently (leaf_reference.py); `credit="turn"` trains each turn's tokens on that turn's return,
normalised per turn index (or per episode) within the group."""

from __future__ import annotations

import math

import pytest
import torch

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import Episode
from areal_nb.train import Actor, GRPOConfig, TrainBatch, compute_advantages

from . import leaf_reference
from .conftest import make_tiny_qwen2

EOS = 1  # the tiny Qwen2's eos id


def _call(iid, messages, prompt, output, parent=None, template="concat", reward=None, logprob=-0.5):
    return InteractionWithTokenLogpReward(
        model_response=ModelResponse(
            input_tokens=prompt,
            output_tokens=output,
            output_logprobs=[logprob] * len(output),
            output_versions=[0] * len(output),
            stop_reason="stop",
            eos_token_ids=[EOS, 0],
        ),
        reward=reward,
        parent=parent,
        chat_template_type=template,
        messages=messages,
        output_message_list=[{"role": "assistant", "content": iid}],
        _interaction_id=iid,
    )


def episode(name, rewards, group_id, sample_id, template="concat"):
    """The math agent's episode: a reply per turn, the correction prompt between them."""
    messages, prompt, calls, parent = [{"role": "user", "content": "q"}], [2, 3, 4], {}, None
    for turn, reward in enumerate(rewards):
        output = (
            [10 + 5 * turn + sample_id, 11 + 5 * turn, EOS]
            if turn % 2 == 0
            else [12 + 5 * turn + sample_id, EOS]
        )
        iid = f"{name}-{turn}"
        call = _call(iid, list(messages), list(prompt), output, parent, template, reward)
        calls[iid] = call
        messages = messages + [{"role": "assistant", "content": iid}, {"role": "user", "content": "again"}]
        prompt = prompt + output + [5, 6]
        parent = call
    return Episode(data={}, group_id=group_id, sample_id=sample_id, version_submitted=0, interactions=calls)


def demo_batch(template="concat", **kwargs) -> RolloutBatch:
    """Two groups of math-agent episodes: wrong-then-fixed, right at once, wrong twice."""
    specs = [
        ("e0", [0.0, 1.0], 0, 0),
        ("e1", [1.0], 0, 1),
        ("e2", [0.0, 0.0], 0, 2),
        ("e3", [0.0, 1.0], 1, 0),
        ("e4", [1.0], 1, 1),
        ("e5", [0.0, 1.0], 1, 2),
    ]
    episodes = [episode(*spec, template=template) for spec in specs]
    return RolloutBatch(episodes, **{"style": "concat", "discount": 0.9, **kwargs})


# ------------------------------------------------------------------ leaf = the rule, written out
LEAF_CONFIGS = {
    "demo": dict(
        reward_norm="group", reward_scaling=10.0, reward_bias=-0.5, eps_clip=0.4, use_decoupled_loss=True
    ),
    "batch-norms-kl": dict(reward_norm="batch", adv_norm="batch", kl_ctl=0.1, kl_estimator="k3"),
    "minibatches": dict(reward_norm="group", ppo_n_minibatches=2, micro_batch_size=2, c_clip=3.0),
    "no-norm": dict(reward_norm=None, reward_clip=0.7),
}


@pytest.mark.parametrize("name", list(LEAF_CONFIGS))
@pytest.mark.parametrize("style", ["concat", "individual"])
def test_leaf_credit_advantages_follow_the_leaf_rule(name, style):
    tensors = demo_batch(style=style).to_tensors().tensors()
    tensors["ref_logprobs"] = torch.linspace(-2.0, -0.5, tensors["logprobs"].numel()).reshape(
        tensors["logprobs"].shape
    )
    cfg = GRPOConfig(**LEAF_CONFIGS[name])
    new = compute_advantages(tensors, cfg)
    expected = leaf_reference.compute_advantages(tensors, cfg)
    for key in ("advantages", "scores", "token_rewards", "kl_rewards", "loss_mask"):
        torch.testing.assert_close(new[key], expected[key], msg=key)  # float32 against Python's doubles


@pytest.mark.parametrize("name", list(LEAF_CONFIGS))
def test_leaf_credit_trains_on_the_leaf_rules_advantages(name, monkeypatch):
    tensors = demo_batch().to_tensors().tensors()
    cfg = GRPOConfig(lr=1e-3, credit="leaf", **LEAF_CONFIGS[name])
    ref = make_tiny_qwen2(1) if cfg.kl_ctl > 0 else None
    new_actor = Actor(make_tiny_qwen2(0), cfg, ref_model=ref)
    new_stats = new_actor.train_step(TrainBatch(**tensors))

    import areal_nb.train.actor_policies as policies_module

    monkeypatch.setattr(
        policies_module,
        "compute_advantages",
        lambda batch, c, g, credit=None: leaf_reference.compute_advantages(batch, c, g),
    )
    oracle_actor = Actor(make_tiny_qwen2(0), cfg, ref_model=ref)
    oracle_stats = oracle_actor.train_step(TrainBatch(**tensors))
    # the oracle's advantages are the trainer's up to float32 rounding: the same step up to it
    assert new_stats["loss"] == pytest.approx(oracle_stats["loss"], rel=1e-5, abs=1e-7)
    assert new_stats["grad_norm"] == pytest.approx(oracle_stats["grad_norm"], rel=1e-5, abs=1e-7)
    for (name_a, a), (_, b) in zip(
        new_actor.model.named_parameters(), oracle_actor.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name_a)


# ------------------------------------------------------------------ turn credit, exact numbers
def test_two_turn_row_rewards_0_then_1_with_discount_0_9():
    batch = RolloutBatch([episode("e", [0.0, 1.0], 0, 0)], style="concat", discount=0.9)
    tensors = batch.to_tensors().tensors()
    gen = tensors["loss_mask"][0].bool()
    assert tensors["turn_ids"][0][gen].tolist() == [0, 0, 0, 1, 1]
    plain = GRPOConfig(reward_norm=None)  # scaling 1, bias 0: the advantage is the return itself
    leaf = compute_advantages(tensors, plain, credit="leaf")["advantages"][0][gen]
    turn = compute_advantages(tensors, plain, credit="turn")["advantages"][0][gen]
    assert leaf.tolist() == [1.0] * 5
    assert turn.tolist() == [pytest.approx(0.9)] * 3 + [1.0, 1.0]  # own 0 + 0.9 × child 1; own 1
    assert (
        compute_advantages(tensors, GRPOConfig(reward_norm=None, credit="turn"))["advantages"].tolist()
        == compute_advantages(tensors, plain, credit="turn")["advantages"].tolist()
    )


def test_turn_level_group_normalisation_by_hand():
    # group 0: e0 (0 then 1), e1 (1), e2 (0 then 0); γ = 0.9 → turn returns e0 (0.9, 1), e1 (1), e2 (0, 0)
    batch = RolloutBatch(
        [episode("e0", [0.0, 1.0], 0, 0), episode("e1", [1.0], 0, 1), episode("e2", [0.0, 0.0], 0, 2)],
        style="concat",
        discount=0.9,
    )
    tensors = batch.to_tensors().tensors()
    cfg = GRPOConfig(reward_norm="group", norm_eps=0.0, credit="turn")
    adv = compute_advantages(tensors, cfg)["advantages"]

    def z(x, pool):
        mean = sum(pool) / len(pool)
        return (x - mean) / math.sqrt(sum((p - mean) ** 2 for p in pool) / (len(pool) - 1))

    first, second = [0.9, 1.0, 0.0], [1.0, 0.0]  # turn 0 of the three samples; turn 1 of e0 and e2
    expected = [
        [z(0.9, first)] * 3 + [z(1.0, second)] * 2,
        [z(1.0, first)] * 3,
        [z(0.0, first)] * 3 + [z(0.0, second)] * 2,
    ]
    for row, want in enumerate(expected):
        got = adv[row][tensors["loss_mask"][row].bool()].tolist()
        assert got == pytest.approx(want, abs=1e-6)
    # whole-episode variant: all five (sample, turn) returns of the group in one pool
    pool = [0.9, 1.0, 1.0, 0.0, 0.0]
    ep = compute_advantages(
        tensors, GRPOConfig(reward_norm="group", norm_eps=0.0, credit="turn", credit_norm="episode")
    )
    assert ep["advantages"][0][tensors["loss_mask"][0].bool()].tolist() == pytest.approx(
        [z(0.9, pool)] * 3 + [z(1.0, pool)] * 2, abs=1e-6
    )
    assert ep["scores"].tolist() == pytest.approx([z(v, pool) for v in pool], abs=1e-6)  # pairs, row-major


def test_individual_hf_rows_with_episode_pool_equal_leaf_credit():
    # one call per row: each row is one turn, so pooling a group's turns is pooling its rows
    tensors = demo_batch(template="hf", style="individual").to_tensors().tensors()
    for cfg in (
        GRPOConfig(reward_scaling=10.0, reward_bias=-0.5),
        GRPOConfig(reward_norm="batch", adv_norm="batch"),
    ):
        leaf = compute_advantages(tensors, cfg, credit="leaf")["advantages"]
        turn = compute_advantages(
            tensors, GRPOConfig(**{**vars(cfg), "credit_norm": "episode"}), credit="turn"
        )
        assert torch.allclose(turn["advantages"], leaf, atol=1e-6, rtol=0)


def test_turn_credit_kl_penalty_is_a_return_to_go():
    batch = RolloutBatch([episode("e", [0.0, 1.0], 0, 0)], style="concat", discount=0.9)
    tensors = batch.to_tensors().tensors()
    tensors["ref_logprobs"] = (
        tensors["logprobs"] - 0.1 * tensors["loss_mask"]
    )  # log r = 0.1 per generated token
    out = compute_advantages(tensors, GRPOConfig(reward_norm=None, kl_ctl=1.0, credit="turn"))
    gen = tensors["loss_mask"][0].bool()
    kl_to_go = [-0.1 * k for k in (5, 4, 3, 2, 1)]
    want = [0.9 + kl_to_go[0], 0.9 + kl_to_go[1], 0.9 + kl_to_go[2], 1.0 + kl_to_go[3], 1.0 + kl_to_go[4]]
    assert out["advantages"][0][gen].tolist() == pytest.approx(want, abs=1e-6)


def test_turn_credit_actor_step_raises_the_fixing_turn_and_reports_it(tiny_qwen2):
    tensors = demo_batch().to_tensors().tensors()
    stats = Actor(tiny_qwen2, GRPOConfig(lr=1e-3)).train_step(TrainBatch(**tensors), credit="turn")
    assert stats["n_tokens"] == float(tensors["loss_mask"].sum())
    assert math.isfinite(stats["loss"]) and stats["adv_max"] > 0 > stats["adv_min"]


def test_turn_credit_errors():
    tensors = demo_batch().to_tensors().tensors()
    with pytest.raises(ValueError, match=r"credit='turn' needs batch\['turn_returns'\]"):
        compute_advantages(
            {k: v for k, v in tensors.items() if k != "turn_returns"}, GRPOConfig(credit="turn")
        )
    broken = dict(tensors, turn_ids=torch.where(tensors["loss_mask"].bool(), -1, tensors["turn_ids"]))
    with pytest.raises(ValueError, match="has turn_id -1"):
        compute_advantages(broken, GRPOConfig(credit="turn"))
    with pytest.raises(ValueError, match="credit must be 'leaf' or 'turn'"):
        compute_advantages(tensors, GRPOConfig(), credit="tree")
    with pytest.raises(ValueError, match=r"credit\n  Input should be 'leaf' or 'turn'"):
        GRPOConfig(credit="turns")
    with pytest.raises(ValueError, match=r"credit_norm\n  Input should be 'turn' or 'episode'"):
        GRPOConfig(credit_norm="group")


def test_config_section_and_batch_reexport_carry_the_credit():
    from areal_nb.config import load_config

    cfg = load_config("configs/multi_turn_math.yaml", ["actor.credit=turn", "actor.credit_norm=episode"])
    assert (cfg.actor.credit, cfg.actor.credit_norm) == ("turn", "episode")
    assert load_config("configs/multi_turn_math.yaml").actor.credit == "leaf"
    batch = demo_batch()
    turn = batch.reexport(credit="turn", discount=0.5)
    assert (batch.credit, turn.credit, turn.discount, turn.episodes is batch.episodes) == (
        "leaf",
        "turn",
        0.5,
        True,
    )
    # the same tensors for both credits (both inputs travel); the discount changes the turn returns
    assert torch.equal(
        batch.reexport(credit="turn").to_tensors().turn_returns, batch.to_tensors().turn_returns
    )
    gen = batch.to_tensors().loss_mask[0].bool()
    assert turn.to_tensors().turn_returns[0][gen].tolist() == [0.5] * 3 + [1.0] * 2
    with pytest.raises(ValueError, match="credit must be one of"):
        batch.reexport(credit="root")

"""Group normalisation and per-token advantages, checked against hand-computed numbers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_nb.train import GRPOConfig, RewardShaping, compute_advantages, group_normalize, kl_estimate


def test_reward_shaping_bias_then_scale_then_clip():
    shaped = RewardShaping(scaling=10.0, bias=-0.5, clip=4.0)(torch.tensor([0.0, 0.6, 1.0]))
    assert shaped.tolist() == pytest.approx([-4.0, 1.0, 4.0])


def test_group_normalize_unequal_interleaved_groups():
    # group sizes 3, 1, 2, rows interleaved: ids 7 → rows 0,3,5; 9 → row 1; 4 → rows 2,4
    rewards = torch.tensor([1.0, 5.0, 0.0, 2.0, 3.0, 4.0])
    out = group_normalize(rewards, [7, 9, 4, 7, 4, 7], eps=0.0)
    mean_a, std_a = 7 / 3, math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    mean_c, std_c = 1.5, math.sqrt((1.5**2 + 1.5**2) / 1)
    expected = [
        (1 - mean_a) / std_a,
        0.0,  # a one-row group has std 1 and its own mean: advantage 0
        (0 - mean_c) / std_c,
        (2 - mean_a) / std_a,
        (3 - mean_c) / std_c,
        (4 - mean_a) / std_a,
    ]
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    # same answer from a tensor of ids and from string ids
    assert torch.equal(group_normalize(rewards, torch.tensor([7, 9, 4, 7, 4, 7]), eps=0.0), out)
    assert torch.equal(group_normalize(rewards, list("abcaca"), eps=0.0), out)


def test_group_normalize_eps_biased_std_and_levels():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0])
    ids = [0, 0, 1, 1]
    # biased std of {1, 0} is 0.5, of {0, 3} is 1.5
    out = group_normalize(rewards, ids, std_unbiased=False, eps=1e-5)
    assert out.tolist() == pytest.approx(
        [0.5 / 0.50001, -0.5 / 0.50001, -1.5 / 1.50001, 1.5 / 1.50001], abs=1e-6
    )
    # centring only
    assert group_normalize(rewards, ids, std_level=None).tolist() == pytest.approx([0.5, -0.5, -1.5, 1.5])
    # batch level needs no ids: mean 1, unbiased std sqrt(6/3)
    batch = group_normalize(rewards, None, "batch", "batch", eps=0.0)
    assert batch.tolist() == pytest.approx(
        [0.0, -1 / math.sqrt(2), -1 / math.sqrt(2), 2 / math.sqrt(2)], abs=1e-6
    )
    # group mean, batch std (around the group means)
    mixed = group_normalize(rewards, ids, "group", "batch", eps=0.0)
    std = math.sqrt((0.25 + 0.25 + 2.25 + 2.25) / 3)
    assert mixed.tolist() == pytest.approx([0.5 / std, -0.5 / std, -1.5 / std, 1.5 / std], abs=1e-6)
    assert torch.equal(group_normalize(rewards, ids, None, None), rewards)


def test_group_normalize_errors():
    with pytest.raises(ValueError, match="needs group_ids"):
        group_normalize(torch.ones(3))
    with pytest.raises(ValueError, match="3 entries for 2 rows"):
        group_normalize(torch.ones(2), [0, 0, 1])
    with pytest.raises(ValueError, match="mean_level"):
        group_normalize(torch.ones(2), [0, 1], mean_level="prompt")


def _multi_turn_batch():
    # row 0: one episode, two turns (prompt, gen, gen, tool, gen); row 1: one turn; row 2: padding
    loss_mask = torch.tensor(
        [
            [0, 1, 1, 0, 1, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 0, 0, 0],
        ]
    )
    attention = torch.tensor(
        [
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    return {"loss_mask": loss_mask, "attention_mask": attention, "rewards": torch.tensor([3.0, 1.0, 2.0])}


def test_advantages_broadcast_score_onto_every_generated_token():
    batch = _multi_turn_batch()
    cfg = GRPOConfig(reward_norm=None, reward_bias=1.0, reward_clip=3.5)
    out = compute_advantages(batch, cfg)
    # scores: clip(r + 1, ±3.5) = 3.5, 2, 3
    expected = torch.tensor(
        [
            [0, 3.5, 3.5, 0, 3.5, 0],
            [0, 0, 2.0, 2.0, 0, 0],
            [0, 0, 3.0, 0, 0, 0],
        ]
    )
    assert torch.equal(out["advantages"], expected)
    assert out["scores"].tolist() == [3.5, 2.0, 3.0]


def test_advantages_group_normalised_with_variable_rows_per_episode():
    # Two rows of the same prompt group come from one multi-turn episode ("individual" export).
    batch = _multi_turn_batch()
    out = compute_advantages(batch, GRPOConfig(norm_eps=0.0), group_ids=[5, 6, 5])
    # group 5 = rows 0, 2 with rewards 3, 2: mean 2.5, unbiased std sqrt(0.5); group 6 is alone
    a = 0.5 / math.sqrt(0.5)
    assert out["scores"].tolist() == pytest.approx([a, 0.0, -a])
    assert out["advantages"][0].tolist() == pytest.approx([0, a, a, 0, a, 0])
    assert out["advantages"][1].tolist() == [0.0] * 6
    assert out["advantages"][2].tolist() == pytest.approx([0, 0, -a, 0, 0, 0])
    # ids may come with the batch
    same = compute_advantages(dict(batch, group_ids=torch.tensor([5, 6, 5])), GRPOConfig(norm_eps=0.0))
    assert torch.equal(same["advantages"], out["advantages"])
    with pytest.raises(ValueError, match="needs group_ids"):
        compute_advantages(batch, GRPOConfig())


def test_kl_penalty_in_token_rewards_accumulates_backwards():
    batch = {
        "loss_mask": torch.tensor([[0, 1, 1, 0, 1]]),
        "rewards": torch.tensor([1.0]),
        "old_logprobs": torch.tensor([[0.0, -1.0, -2.0, 0.0, -0.5]]),
        "logprobs": torch.full((1, 5), 99.0),  # ignored: old_logprobs takes precedence
        "ref_logprobs": torch.tensor([[0.0, -1.5, -1.0, -9.0, -0.5]]),
    }
    cfg = GRPOConfig(reward_norm=None, kl_ctl=0.1, kl_estimator="k1")
    out = compute_advantages(batch, cfg)
    # k1 = old − ref on generated tokens: 0.5, −1.0, 0.0 → token rewards −0.05, +0.1, 0 (+1 score at t=4)
    assert out["kl_rewards"][0].tolist() == pytest.approx([0, -0.05, 0.1, 0, 0])
    assert out["token_rewards"][0].tolist() == pytest.approx([0, -0.05, 0.1, 0, 1.0])
    assert out["advantages"][0].tolist() == pytest.approx([0, 1.05, 1.1, 0, 1.0])
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_advantages({k: v for k, v in batch.items() if k != "ref_logprobs"}, cfg)


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([1.0, -1.0])
    assert kl_estimate(logp, ref, "k2").tolist() == pytest.approx([0.5, 0.5])
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([math.exp(-1) - 1 + 1, math.exp(1) - 1 - 1])
    assert kl_estimate(torch.tensor([0.0]), torch.tensor([-50.0]), "k1").item() == 10.0  # clamped


def test_batch_advantage_normalisation_over_generated_tokens():
    batch = _multi_turn_batch()
    out = compute_advantages(batch, GRPOConfig(reward_norm=None, adv_norm="batch", norm_eps=0.0))
    raw = [3.0, 3.0, 3.0, 1.0, 1.0, 2.0]  # row0 ×3, row1 ×2, row2 ×1
    mean = sum(raw) / 6
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 5)
    adv = out["advantages"]
    assert adv[0, 1].item() == pytest.approx((3 - mean) / std)
    assert adv[1, 3].item() == pytest.approx((1 - mean) / std)
    assert adv[2, 2].item() == pytest.approx((2 - mean) / std)
    assert adv[~out["loss_mask"]].abs().sum().item() == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=20))
def test_group_normalize_matches_a_per_group_loop(rows):
    ids = [g for g, _ in rows]
    rewards = torch.tensor([r for _, r in rows])
    out = group_normalize(rewards, ids, eps=1e-5)
    for i, (g, r) in enumerate(rows):
        members = [x for h, x in rows if h == g]
        mean = sum(members) / len(members)
        std = (
            math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1)) if len(members) > 1 else 1.0
        )
        assert out[i].item() == pytest.approx((r - mean) / (std + 1e-5), abs=1e-4)

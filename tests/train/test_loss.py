"""PPO actor loss: clipping on both sides, dual clip, decoupled weight and cap, micro-batching."""

import math

import pytest
import torch

from areal_nb.train import ppo_actor_loss

LOG = math.log


def test_clipping_on_both_sides_values_and_gradients():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, −1, −1, +1
    logp = torch.tensor([[LOG(1.5), LOG(0.5), LOG(1.5), LOG(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, stats = ppo_actor_loss(logp, old, adv, torch.ones(1, 4), eps_clip=0.2)
    # token losses: −1.2 (clipped at 1.2), 0.8 (clipped at 0.8), 1.5, −0.5
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 1.5 - 0.5) / 4)
    assert stats["clip_frac"] == 0.5
    assert stats["importance_weight_max"] == pytest.approx(1.5)
    assert stats["importance_weight_min"] == pytest.approx(0.5)
    assert stats["importance_weight_mean"] == pytest.approx(1.0)
    loss.backward()
    # d/dlogp (−A·r) = −A·r for unclipped tokens, 0 for clipped ones; /4 tokens
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.5 / 4, -0.5 / 4])


def test_asymmetric_clip_higher():
    logp = torch.tensor([[LOG(1.5)]])
    loss, stats = ppo_actor_loss(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), eps_clip=0.2, eps_clip_higher=0.28
    )
    assert loss.item() == pytest.approx(-1.28)
    assert stats["clip_frac"] == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    logp = torch.tensor([[LOG(5.0), LOG(2.0), LOG(5.0)]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, stats = ppo_actor_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), c_clip=3.0)
    # −A·r = 5 capped at 3; ratio 2 → 2 (below cap); positive A: −1.2 (clip)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert stats["dual_clip_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="c_clip must be > 1"):
        ppo_actor_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), c_clip=1.0)


def test_decoupled_loss_applies_behaviour_weight_and_masks_above_cap():
    old = torch.zeros(1, 4)  # π_behave
    prox = torch.tensor([[LOG(2.0), LOG(0.5), LOG(8.0), 0.0]])  # behaviour weights 2, 0.5, 8 (> cap), 1
    logp = prox + torch.tensor([[LOG(1.1), LOG(1.5), 0.0, LOG(0.9)]])  # ratios to prox: 1.1, 1.5, 1, 0.9
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    loss, stats = ppo_actor_loss(
        logp, old, adv, torch.ones(1, 4), prox_logprobs=prox, behave_imp_weight_cap=5.0
    )
    # token losses × weight: −1.1·2, −1.2·0.5, (masked), 0.9·1; normaliser counts all 4 tokens
    assert loss.item() == pytest.approx((-2.2 - 0.6 + 0.9) / 4)
    assert stats["behave_imp_weight_max"] == pytest.approx(8.0)
    assert stats["behave_imp_weight_min"] == pytest.approx(0.5)
    assert stats["behave_masked_frac"] == 0.25
    assert stats["clip_frac"] == 0.25
    # without a cap the weight-8 token counts: −1·8
    uncapped, _ = ppo_actor_loss(logp, old, adv, torch.ones(1, 4), prox_logprobs=prox)
    assert uncapped.item() == pytest.approx((-2.2 - 0.6 - 8.0 + 0.9) / 4)


def test_mask_excludes_tokens_and_padding_values_cannot_poison():
    logp = torch.tensor([[LOG(1.1), float("-inf"), 0.0]])
    old = torch.tensor([[0.0, 0.0, float("-inf")]])
    adv = torch.tensor([[2.0, 5.0, 5.0]])
    loss, stats = ppo_actor_loss(logp, old, adv, torch.tensor([[1, 0, 0]]))
    assert loss.item() == pytest.approx(-2.2)
    assert stats["n_tokens"] == 1.0
    empty, empty_stats = ppo_actor_loss(logp, old, adv, torch.zeros(1, 3))
    assert empty.item() == 0.0 and empty_stats["clip_frac"] == 0.0


def test_approx_kl_is_k3_and_k1():
    logp = torch.tensor([[LOG(2.0), LOG(0.5)]])
    _, stats = ppo_actor_loss(
        logp, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), entropy=torch.tensor([[1.0, 3.0]])
    )
    assert stats["approx_kl"] == pytest.approx(((2 - 1 - LOG(2)) + (0.5 - 1 - LOG(0.5))) / 2)
    assert stats["approx_kl_k1"] == pytest.approx((-LOG(2) - LOG(0.5)) / 2)
    assert stats["entropy"] == pytest.approx(2.0)


def test_micro_batches_with_minibatch_normaliser_give_the_token_mean():
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(5, 7, generator=gen) * 0.3 - 1).requires_grad_()
    old = logp.detach() + torch.randn(5, 7, generator=gen) * 0.3
    adv = torch.randn(5, 7, generator=gen)
    mask = torch.rand(5, 7, generator=gen) > 0.4
    full, _ = ppo_actor_loss(logp, old, adv, mask)
    full.backward()
    full_grad = logp.grad.clone()
    logp.grad = None
    total = int(mask.sum())
    parts = [
        ppo_actor_loss(logp[r], old[r], adv[r], mask[r], normalizer=total)[0]
        for r in (slice(0, 2), slice(2, 5))
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)
    sum(parts).backward()
    assert torch.allclose(logp.grad, full_grad, atol=1e-7)
    # a plain mean of micro-batch means is NOT the token mean (rows have different token counts)
    means = [ppo_actor_loss(logp[r], old[r], adv[r], mask[r])[0].item() for r in (slice(0, 2), slice(2, 5))]
    assert sum(means) / 2 != pytest.approx(full.item(), abs=1e-4)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="share a shape"):
        ppo_actor_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))

"""The decoupled (off-policy) PPO loss against an independent transcription of AReaL's
`ppo_actor_loss_fn` (with its `rejection_sampling` mask of the behaviour weight,
which areal_nb always applies), on fixed tensors and on a real stale batch: tokens sampled by the
engine two versions before the weights that train them.
"""

import copy

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig, ppo_actor_loss
from areal_nb.train.logprobs import compute_token_logprobs_and_entropy

from .conftest import make_tiny_qwen2
from .test_engine_roundtrip import rollout


def areal_ppo_actor_loss(
    logprobs,
    proximal_logprobs,
    old_logprobs,
    advantages,
    loss_mask,
    eps_clip,
    eps_clip_higher=None,
    c_clip=None,
    behav_imp_weight_cap=None,
):
    """AReaL's arithmetic as the reference digest states it, written out step by step."""
    loss_mask = loss_mask.bool()
    loss_mask_count = int(loss_mask.count_nonzero()) or 1  # taken before the behaviour mask
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0.0)
    clipped_ratio = torch.clamp(
        ratio, 1.0 - eps_clip, 1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher)
    )
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    if c_clip is not None:
        pg_loss3 = torch.sign(advantages) * c_clip * advantages
        pg_loss = torch.min(pg_loss, pg_loss3)
    if proximal_logprobs is not old_logprobs:
        behav_imp_weight = (proximal_logprobs - old_logprobs).exp()
        behav_mask = (
            loss_mask
            if behav_imp_weight_cap is None
            else (behav_imp_weight <= behav_imp_weight_cap) & loss_mask
        )
        behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
        pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0.0).sum() / loss_mask_count


@pytest.mark.parametrize("c_clip", [None, 3.0])
@pytest.mark.parametrize("eps_clip_higher", [None, 0.28])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_loss_and_gradient_equal_areals_on_stale_tokens(c_clip, eps_clip_higher, cap):
    gen = torch.Generator().manual_seed(7)
    shape = (6, 9)
    behave = torch.randn(shape, generator=gen) * 0.5 - 1.5  # π_behave: an older engine version
    prox = behave + torch.randn(shape, generator=gen) * 0.6  # π_prox: the weights before this step
    theta = (prox + torch.randn(shape, generator=gen) * 0.4).requires_grad_()  # π_θ: moved within the step
    adv = torch.randn(shape, generator=gen) * 2
    mask = torch.rand(shape, generator=gen) > 0.3
    mask[0] = False  # a row with no loss token (prompt only)
    kw = dict(eps_clip=0.2, eps_clip_higher=eps_clip_higher, c_clip=c_clip)

    ours, stats = ppo_actor_loss(
        theta, behave, adv, mask, prox_logprobs=prox, behave_imp_weight_cap=cap, **kw
    )
    (grad_ours,) = torch.autograd.grad(ours, theta)
    ref = areal_ppo_actor_loss(theta, prox, behave, adv, mask, behav_imp_weight_cap=cap, **kw)
    (grad_ref,) = torch.autograd.grad(ref, theta)

    assert ours.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=1e-6, atol=1e-8)
    weights = (prox - behave).exp()[mask]
    assert stats["behave_masked_frac"] == pytest.approx(
        0.0 if cap is None else float((weights > cap).float().mean())
    )
    assert stats["clip_frac"] > 0 and (
        cap is None or stats["behave_masked_frac"] > 0
    )  # both mechanisms exercised


def test_on_policy_decoupled_equals_plain_ppo():
    """With π_prox = π_behave (nothing stale) the behaviour weight is 1: the decoupled loss is PPO."""
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(4, 5, generator=gen) - 1
    theta = old + torch.randn(4, 5, generator=gen) * 0.3
    adv = torch.randn(4, 5, generator=gen)
    mask = torch.rand(4, 5, generator=gen) > 0.2
    plain, _ = ppo_actor_loss(theta, old, adv, mask, eps_clip=0.2)
    decoupled, stats = ppo_actor_loss(
        theta, old, adv, mask, eps_clip=0.2, prox_logprobs=old.clone(), behave_imp_weight_cap=5.0
    )
    assert decoupled.item() == pytest.approx(plain.item(), abs=1e-7)
    assert stats["behave_imp_weight_min"] == stats["behave_imp_weight_max"] == 1.0


@pytest.fixture(scope="module")
def stale_setup():
    """A batch the engine sampled at version 0, and an actor two training steps further on."""
    from areal_nb.engine import LocalEngine

    model = make_tiny_qwen2()
    engine = LocalEngine(model, device="cpu", seed=0)
    try:
        stale, stale_groups = rollout(engine, n_samples=4, temperature=1.0)
        actor = Actor(
            copy.deepcopy(model), GRPOConfig(lr=3e-2, use_decoupled_loss=True, behave_imp_weight_cap=5.0)
        )
        for _ in range(2):  # the policy moves on: versions 1, 2
            batch, groups = rollout(engine, n_samples=4, temperature=1.0)
            actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
            actor.push_weights(engine)
    finally:
        engine.close()
    return stale, stale_groups, actor


@pytest.mark.parametrize("skip", [True, False], ids=["forward-as-prox", "recomputed"])
def test_stale_batch_takes_prox_from_the_current_weights_and_matches_areal(stale_setup, skip):
    stale, groups, actor = stale_setup
    actor = copy.deepcopy(actor)
    actor.cfg.skip_redundant_recompute = skip
    assert actor.version == 2
    mask = stale["loss_mask"].bool() & stale["attention_mask"].bool()
    # π_prox: a teacher-forced pass of the weights as they are before this step (version 2)
    with torch.no_grad():
        prox, _ = compute_token_logprobs_and_entropy(
            actor.model, stale["input_ids"], stale["attention_mask"].bool(), 1.0
        )
    stats = actor.train_step(TrainBatch(**stale, group_ids=torch.as_tensor(groups)), inspect=True)
    seen = actor.last_inspection
    assert stats["staleness_mean"] == stats["staleness_max"] == 2.0
    torch.testing.assert_close(seen.prox_logprobs[mask], prox[mask], atol=1e-5, rtol=0)
    # the behaviour weight is π_prox / π_behave with π_behave the engine's record at version 0
    engine_lp = stale["logprobs"].float()
    torch.testing.assert_close(seen.behave_weight[mask], (prox - engine_lp).exp()[mask], atol=1e-4, rtol=1e-4)
    assert float((prox - engine_lp)[mask].abs().max()) > 0.05  # the weights did move: the test has teeth
    # the whole step's loss is AReaL's on the same tensors (the forward at the update is π_θ = π_prox)
    expected = areal_ppo_actor_loss(
        prox, prox, engine_lp, seen.advantages, mask, eps_clip=0.2, behav_imp_weight_cap=5.0
    )
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)

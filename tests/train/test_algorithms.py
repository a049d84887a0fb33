"""Each algorithm variant against an independent transcription of its published formula.

The transcriptions below are written per row and per token with Python loops (no code shared
with `areal_nb.train`); the fixed tensors have rows of unequal length, a group whose rewards are
all equal, and stale tokens (behaviour log-probs far from π_prox).
"""

import math

import pytest
import torch

from areal_nb.train import GRPOConfig
from areal_nb.train.advantages import compute_advantages
from areal_nb.train.algorithms import ALGORITHMS, PRESETS, configure, informative_groups, overlong_penalty
from areal_nb.train.mismatch import mismatch_report, mismatch_weights
from areal_nb.train.policy_loss import loss_normalizer, policy_loss_terms

TOL = 1e-6
LENGTHS = [3, 5, 2, 4, 1, 4]  # generated tokens per row (unequal)
GROUPS = [0, 0, 0, 1, 1, 1]  # group 1 has equal rewards
REWARDS = [1.0, 0.0, 0.5, 1.0, 1.0, 1.0]
WIDTH = 7  # two prompt tokens, then the completion, then padding


def fixed_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(LENGTHS), WIDTH)
    for i, n in enumerate(LENGTHS):
        mask[i, 2 : 2 + n] = 1
    logp = -torch.rand(len(LENGTHS), WIDTH, generator=g) * 2 - 0.1  # π_θ
    prox = logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.6  # π_prox (no gradient)
    old = prox + (torch.rand(logp.shape, generator=g) - 0.5) * 0.4  # π_behave
    old[1, 3] = prox[1, 3] - 2.5  # a stale token: behaviour weight e^2.5 > cap 5
    adv = torch.randn(len(LENGTHS), WIDTH, generator=g)
    return mask, logp * mask, prox * mask, old * mask, adv * mask


def rows_of(mask):
    return [[t for t in range(WIDTH) if mask[i, t]] for i in range(mask.shape[0])]


# ------------------------------------------------------------------ advantages
def adv_batch():
    mask = torch.zeros(len(LENGTHS), WIDTH)
    for i, n in enumerate(LENGTHS):
        mask[i, 2 : 2 + n] = 1
    return {"rewards": torch.tensor(REWARDS), "loss_mask": mask, "group_ids": torch.tensor(GROUPS)}


def group_members(i):
    return [j for j in range(len(GROUPS)) if GROUPS[j] == GROUPS[i]]


def transcribe_advantage(estimator, i, eps=1e-5):
    r = REWARDS
    members = group_members(i)
    n = len(members)
    mean = sum(r[j] for j in members) / n
    if estimator == "grpo":  # (r − mean) / (std + eps), unbiased std
        std = math.sqrt(sum((r[j] - mean) ** 2 for j in members) / (n - 1))
        return (r[i] - mean) / (std + eps)
    if estimator == "dr_grpo":  # r − mean
        return r[i] - mean
    if estimator == "rloo":  # r_i − mean of the others
        return r[i] - sum(r[j] for j in members if j != i) / (n - 1)
    raise AssertionError(estimator)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_match_their_formulas(estimator):
    out = compute_advantages(adv_batch(), GRPOConfig(adv_estimator=estimator))
    for i, n in enumerate(LENGTHS):
        expected = transcribe_advantage(estimator, i)
        assert out["advantages"][i, 2 : 2 + n].tolist() == pytest.approx([expected] * n, abs=TOL)
        assert float(out["advantages"][i, 2 + n :].abs().sum()) == 0.0
    # the group whose rewards are all equal teaches nothing under any group baseline
    assert float(out["advantages"][3:].abs().max()) == 0.0


def test_reinforce_pp_normalises_returns_over_the_batch_tokens():
    out = compute_advantages(adv_batch(), GRPOConfig(algorithm="reinforce_pp"))
    returns = [
        REWARDS[i] for i, n in enumerate(LENGTHS) for _ in range(n)
    ]  # γ = 1: every token's return-to-go
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / (len(returns) - 1))
    for i, n in enumerate(LENGTHS):
        expected = (REWARDS[i] - mean) / (std + 1e-5)
        assert out["advantages"][i, 2 : 2 + n].tolist() == pytest.approx([expected] * n, abs=TOL)


def test_grpo_estimator_is_todays_group_normalisation_bit_for_bit():
    batch = adv_batch()
    today = compute_advantages(batch, GRPOConfig())["advantages"]
    explicit = compute_advantages(batch, GRPOConfig(algorithm="dapo", adv_estimator="grpo"))["advantages"]
    assert torch.equal(today, explicit)


def test_turn_credit_runs_under_every_estimator_with_its_pools():
    batch = adv_batch()
    batch["turn_ids"] = torch.where(batch["loss_mask"] > 0, 0, -1)  # one turn per row
    batch["turn_returns"] = batch["rewards"][:, None] * batch["loss_mask"]
    for estimator in ("grpo", "dr_grpo", "rloo"):
        leaf = compute_advantages(batch, GRPOConfig(adv_estimator=estimator, credit_norm="episode"))
        turn = compute_advantages(
            batch, GRPOConfig(adv_estimator=estimator, credit="turn", credit_norm="episode")
        )
        # one turn per row: the turn rule pools exactly as the leaf rule does
        assert torch.allclose(leaf["advantages"], turn["advantages"], atol=TOL)


# ------------------------------------------------------------------ aggregation
def ppo_token_loss(logp, anchor, a, eps_low, eps_high):
    r = math.exp(logp - anchor)
    return max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_aggregations_match_their_formulas(agg):
    mask, logp, _, old, adv = fixed_batch()
    rows = rows_of(mask)
    per_token = [
        [
            ppo_token_loss(float(logp[i, t].detach()), float(old[i, t]), float(adv[i, t]), 0.2, 0.2)
            for t in row
        ]
        for i, row in enumerate(rows)
    ]
    if agg == "token_mean":  # Σ ℓ / N (DAPO)
        expected = sum(map(sum, per_token)) / sum(map(len, per_token))
    elif agg == "seq_mean_token_mean":  # mean over rows of each row's mean (GRPO paper)
        expected = sum(sum(row) / len(row) for row in per_token) / len(per_token)
    else:  # Σ_i Σ_t ℓ / (R · C), C the longest row (Dr. GRPO)
        expected = sum(map(sum, per_token)) / (len(per_token) * max(LENGTHS))
    normalizer = loss_normalizer(mask, torch.arange(mask.shape[0]), agg)
    terms = policy_loss_terms(logp, old, adv, mask, normalizer=normalizer)
    assert float(terms.loss.detach()) == pytest.approx(expected, abs=TOL)


def test_seq_sum_norm_takes_an_explicit_constant():
    mask, logp, _, old, adv = fixed_batch()
    a = policy_loss_terms(
        logp, old, adv, mask, normalizer=loss_normalizer(mask, torch.arange(6), "seq_sum_norm", 10)
    )
    b = policy_loss_terms(
        logp, old, adv, mask, normalizer=loss_normalizer(mask, torch.arange(6), "seq_sum_norm")
    )
    assert float(a.loss) * 10 == pytest.approx(float(b.loss) * max(LENGTHS), abs=TOL)


# ------------------------------------------------------------------ GSPO and CISPO, with gradients
def gspo_reference(logp, old, adv, mask, eps_low, eps_high):
    """GSPO's objective as published: (1/G) Σ_i min(s_i A_i, clip(s_i, 1−ε, 1+ε) A_i),
    s_i = exp((1/|y_i|) Σ_t log(π_θ/π_old)); A_i the row's advantage (one per sequence)."""
    total = 0.0
    rows = rows_of(mask)
    for i, row in enumerate(rows):
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in row) / len(row))
        a = adv[i, row[0]]
        total = total + torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
    return -total / len(rows)


def test_gspo_loss_and_gradient_match_the_sequence_objective():
    mask, logp0, _, old, adv_tokens = fixed_batch()
    # GSPO's advantage is per sequence: every token of a row holds the row's value
    adv = torch.stack([adv_tokens[i, 2].expand(WIDTH) for i in range(len(LENGTHS))]) * mask
    old = logp0 + (old - logp0).clamp(-0.02, 0.02) * mask  # near-on-policy, so some rows clip and some do not
    for eps in ((3e-4, 4e-4), (0.2, 0.2)):
        ours_logp = logp0.clone().requires_grad_(True)
        ref_logp = logp0.clone().requires_grad_(True)
        normalizer = loss_normalizer(mask, torch.arange(6), "seq_mean_token_mean")
        terms = policy_loss_terms(
            ours_logp,
            old,
            adv,
            mask,
            importance_level="sequence",
            eps_clip=eps[0],
            eps_clip_higher=eps[1],
            normalizer=normalizer,
        )
        expected = gspo_reference(ref_logp, old, adv, mask, *eps)
        terms.loss.backward()
        expected.backward()
        assert float(terms.loss.detach()) == pytest.approx(float(expected.detach()), abs=TOL)
        assert torch.allclose(ours_logp.grad, ref_logp.grad, atol=TOL)
    assert bool(terms.clipped.any()) is False  # wide range: nothing clipped; the narrow one clipped some
    narrow = policy_loss_terms(
        logp0, old, adv, mask, importance_level="sequence", eps_clip=3e-4, eps_clip_higher=4e-4
    )
    row_clipped = [bool(narrow.clipped[i, 2]) for i in range(6)]
    assert any(row_clipped) and not all(row_clipped)
    for i, n in enumerate(LENGTHS):  # clipping is decided per sequence
        assert narrow.clipped[i, 2 : 2 + n].tolist() == [row_clipped[i]] * n


def cispo_reference(logp, old, adv, mask, eps_low, eps_high):
    """MiniMax-M1's CISPO: J = 1/Σ|o_i| Σ_i Σ_t sg(clip(r_t, 1−ε_low, 1+ε_high)) A_t log π_θ(o_t)."""
    total, count = 0.0, 0
    for i, row in enumerate(rows_of(mask)):
        for t in row:
            r = math.exp(float(logp[i, t].detach()) - float(old[i, t]))
            weight = min(max(r, 1 - eps_low), 1 + eps_high)
            total = total + weight * float(adv[i, t]) * logp[i, t]
            count += 1
    return -total / count


def test_cispo_loss_and_gradient_match_its_formula():
    mask, logp0, _, old, adv = fixed_batch()
    cfg = GRPOConfig(algorithm="cispo")
    old = old.clone()
    old[0, 2] = logp0[0, 2] - 2.0  # r = e^2 = 7.39 > 1 + 4: the weight is truncated at 5
    ours_logp = logp0.clone().requires_grad_(True)
    ref_logp = logp0.clone().requires_grad_(True)
    terms = policy_loss_terms(
        ours_logp,
        old,
        adv,
        mask,
        policy_loss="cispo",
        eps_clip=cfg.eps_clip,
        eps_clip_higher=cfg.eps_clip_higher,
    )
    expected = cispo_reference(ref_logp, old, adv, mask, cfg.eps_clip, cfg.eps_clip_higher)
    terms.loss.backward()
    expected.backward()
    assert float(terms.loss.detach()) == pytest.approx(float(expected.detach()), abs=TOL)
    assert torch.allclose(ours_logp.grad, ref_logp.grad, atol=TOL)
    assert torch.equal(terms.clipped, ((logp0 - old).exp() > 5.0) & mask.bool()) and bool(terms.clipped[0, 2])
    # every token keeps a gradient, the truncated one included (PPO's clip would zero it)
    assert float(ours_logp.grad[0, 2].abs()) > 0


# ------------------------------------------------------------------ decoupled loss with stale tokens
def test_variants_apply_the_behaviour_weight_and_cap_on_stale_tokens():
    mask, logp0, prox, old, adv = fixed_batch()
    cap = 5.0
    ours_logp = logp0.clone().requires_grad_(True)
    terms = policy_loss_terms(
        ours_logp,
        old,
        adv,
        mask,
        importance_level="sequence",
        eps_clip=0.2,
        prox_logprobs=prox,
        behave_imp_weight_cap=cap,
        normalizer=loss_normalizer(mask, torch.arange(6), "seq_mean_token_mean"),
    )
    ref_logp = logp0.clone().requires_grad_(True)
    total = 0.0
    rows = rows_of(mask)
    for i, row in enumerate(rows):
        s = torch.exp(sum(ref_logp[i, t] - prox[i, t] for t in row) / len(row))
        row_sum = 0.0
        for t in row:
            w = math.exp(float(prox[i, t]) - float(old[i, t]))
            if w > cap:  # masked: contributes nothing, still counted in the row's length
                continue
            a = float(adv[i, t])
            s_t = s.detach() * torch.exp(ref_logp[i, t] - ref_logp[i, t].detach())  # GSPO-token
            row_sum = row_sum + w * torch.maximum(-a * s_t, -a * s_t.clamp(0.8, 1.2))
        total = total + row_sum / len(row)
    expected = total / len(rows)
    terms.loss.backward()
    expected.backward()
    assert float(terms.loss.detach()) == pytest.approx(float(expected.detach()), abs=TOL)
    assert torch.allclose(ours_logp.grad, ref_logp.grad, atol=TOL)
    assert bool(terms.behave_capped[1, 3]) and int(terms.behave_capped.sum()) == 1


# ------------------------------------------------------------------ train-inference mismatch
def planted():
    """Trainer log-probs and an engine record that differs by known amounts."""
    mask = torch.zeros(3, 5)
    mask[0, 1:4] = 1
    mask[1, 1:5] = 1
    mask[2, 2:4] = 1
    trainer = -torch.ones(3, 5) * mask
    delta = torch.zeros(3, 5)
    delta[0, 1], delta[0, 2] = 1.0, 0.3  # trainer − engine: w = e^1 = 2.72 > 2 (row 0 total 1.3)
    delta[1, 1:5] = torch.tensor([0.2, 0.2, 0.2, 0.2])  # each e^0.2 = 1.22 ≤ 2; row total e^0.8 = 2.23 > 2
    delta[2, 2] = -0.5  # below 1: never bounded
    return trainer, trainer - delta * mask, mask, delta


def test_token_tis_truncates_and_mis_masks_the_planted_tokens():
    trainer, engine, mask, delta = planted()
    w = torch.where(mask.bool(), delta.exp(), 1.0)
    tis = mismatch_weights(trainer, engine, mask, "tis", "token", 2.0)
    assert torch.allclose(tis.weight, w.clamp(max=2.0), atol=TOL)
    assert tis.truncated.nonzero().tolist() == [[0, 1]] and not tis.masked.any()
    mis = mismatch_weights(trainer, engine, mask, "mis", "token", 2.0)
    assert torch.allclose(mis.weight, torch.where(w > 2.0, 0.0, w), atol=TOL)
    assert mis.masked.nonzero().tolist() == [[0, 1]] and not mis.truncated.any()


def test_sequence_tis_and_mis_bound_the_product_of_a_rows_weights():
    trainer, engine, mask, delta = planted()
    seq = (delta * mask).sum(1).exp()  # 3.67, 2.23, 0.61
    tis = mismatch_weights(trainer, engine, mask, "tis", "sequence", 2.0)
    mis = mismatch_weights(trainer, engine, mask, "mis", "sequence", 2.0)
    for i in range(3):
        on = mask[i].bool()
        assert torch.allclose(
            tis.weight[i][on], torch.full((int(on.sum()),), min(float(seq[i]), 2.0)), atol=TOL
        )
        expected_mis = 0.0 if seq[i] > 2.0 else float(seq[i])
        assert torch.allclose(mis.weight[i][on], torch.full((int(on.sum()),), expected_mis), atol=TOL)
    assert mis.masked.sum(1).tolist() == [3, 4, 0]
    assert tis.truncated.sum(1).tolist() == [3, 4, 0]


def test_mismatch_weight_multiplies_each_tokens_loss_term():
    trainer, engine, mask, delta = planted()
    adv = torch.linspace(-1, 1, 15).reshape(3, 5) * mask
    logp = (trainer + 0.05 * mask).requires_grad_(True)
    for correction in ("tis", "mis"):
        m = mismatch_weights(trainer, engine, mask, correction, "token", 2.0)
        terms = policy_loss_terms(logp, trainer, adv, mask, mismatch=m)
        expected, n = 0.0, int(mask.sum())
        for i, t in mask.nonzero().tolist():
            w = math.exp(float(delta[i, t]))
            if w > 2.0:
                w = 2.0 if correction == "tis" else 0.0
            expected += (
                w
                * ppo_token_loss(float(logp[i, t].detach()), float(trainer[i, t]), float(adv[i, t]), 0.2, 0.2)
                / n
            )
        assert float(terms.loss.detach()) == pytest.approx(expected, abs=TOL)


def test_mismatch_report_gives_the_metrics_every_step_and_the_fractions_with_a_correction():
    trainer, engine, mask, delta = planted()
    d = delta[mask.bool()]
    plain = mismatch_report(GRPOConfig(), trainer, engine, mask)
    assert plain["mismatch_logp_abs_diff"] == pytest.approx(float(d.abs().mean()), abs=TOL)
    assert plain["mismatch_kl_k3"] == pytest.approx(float((d.exp() - 1 - d).mean()), abs=TOL)
    assert plain["mismatch_masked_frac"] == 0.0 and plain["mismatch_truncated_frac"] == 0.0
    mis = mismatch_report(
        GRPOConfig(mismatch_correction="mis", mismatch_level="sequence"), trainer, engine, mask
    )
    assert mis["mismatch_masked_frac"] == pytest.approx(7 / 9)


# ------------------------------------------------------------------ DAPO's overlong penalty and filter
def test_overlong_penalty_follows_dapo_piecewise_rule():
    lengths = torch.tensor([10, 16, 18, 20, 21])
    # L_max 20, L_cache 4: free up to 16, a linear ramp to −1 at 20, −1 beyond
    assert overlong_penalty(lengths, 20, 4).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    cfg = GRPOConfig(overlong_max_len=4, overlong_buffer=2, reward_norm=None)
    out = compute_advantages(adv_batch(), cfg)  # lengths 3, 5, 2, 4, 1, 4
    assert out["scores"].tolist() == pytest.approx([1 - 0.5, 0 - 1, 0.5, 1 - 1, 1.0, 1 - 1])


def test_informative_groups_drop_groups_with_equal_rewards():
    assert informative_groups(REWARDS, GROUPS) == {0}
    assert informative_groups(torch.tensor([1.0, 1.0, 0.0]), ["a", "a", "b"]) == set()


# ------------------------------------------------------------------ presets
def test_every_preset_resolves_and_explicit_knobs_win():
    for name in ALGORITHMS:
        cfg = GRPOConfig(algorithm=name)
        assert {k: getattr(cfg, k) for k in PRESETS[name]} == PRESETS[name]
    cfg = GRPOConfig(algorithm="gspo", eps_clip=0.1, loss_agg="token_mean")
    assert (cfg.eps_clip, cfg.eps_clip_higher, cfg.loss_agg, cfg.importance_level) == (
        0.1,
        4e-4,
        "token_mean",
        "sequence",
    )


def test_configure_switches_preset_keeping_other_knobs():
    base = GRPOConfig(lr=1e-3, eps_clip=0.4)
    gspo = configure(base, "gspo")
    assert (gspo.lr, gspo.eps_clip, gspo.importance_level) == (1e-3, 3e-4, "sequence")
    assert configure(base, "grpo", c_clip=3.0).eps_clip == 0.4
    with pytest.raises(ValueError, match="unknown actor knob"):
        configure(base, "gspo", eps_clipp=0.1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"algorithm": "ppo2"}, r"algorithm\n  Input should be 'grpo', 'dr_grpo'"),
        ({"loss_agg": "mean"}, r"loss_agg\n  Input should be 'token_mean'"),
        ({"mismatch_correction": "tis", "use_decoupled_loss": True}, "decoupled loss already weights"),
        ({"mismatch_correction": "tis", "recompute_logprob": False}, "recompute_logprob=true"),
        ({"overlong_buffer": 3}, "overlong_buffer"),
        ({"mismatch_threshold": 1.0}, "mismatch_threshold"),
    ],
)
def test_bad_algorithm_knobs_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**kwargs)

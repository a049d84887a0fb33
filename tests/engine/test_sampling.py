"""`sample_next_tokens`: per-row parameters, truncation, and the pre-truncation log-prob convention."""

from __future__ import annotations

import math

import torch

from areal_nb.engine.sampling import SamplingParams, sample_next_tokens

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _draw(params: SamplingParams, n: int = 400, seed: int = 0) -> tuple[set[int], torch.Tensor]:
    logits = PROBS.log().repeat(n, 1)
    gen = torch.Generator().manual_seed(seed)
    tokens, logprobs = sample_next_tokens(logits, [params] * n, gen)
    return set(tokens.tolist()), logprobs[tokens == 0][:1]


def test_top_p_keeps_the_nucleus_and_reports_untruncated_logprob():
    seen, lp0 = _draw(SamplingParams(greedy=False, top_p=0.7))
    assert seen == {0, 1}
    assert math.isclose(float(lp0), math.log(0.5), abs_tol=1e-6)


def test_top_k_keeps_k_best():
    seen, lp0 = _draw(SamplingParams(greedy=False, top_k=3))
    assert seen == {0, 1, 2}
    assert math.isclose(float(lp0), math.log(0.5), abs_tol=1e-6)


def test_untruncated_sampling_reaches_every_token():
    seen, _ = _draw(SamplingParams(greedy=False))
    assert seen == {0, 1, 2, 3}


def test_temperature_scales_the_reported_logprob():
    logits = PROBS.log()[None]
    tokens, logprobs = sample_next_tokens(
        logits, [SamplingParams(greedy=False, temperature=0.5, top_k=1)], torch.Generator().manual_seed(0)
    )
    expected = torch.log_softmax(PROBS.log() / 0.5, dim=-1)[0]
    assert tokens.tolist() == [0]
    assert math.isclose(float(logprobs[0]), float(expected), abs_tol=1e-6)


def test_rows_use_their_own_parameters_and_greedy_reports_plain_log_softmax():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    params = [
        SamplingParams(greedy=True),
        SamplingParams(greedy=False, temperature=2.0, top_k=1),
        SamplingParams(greedy=False, temperature=0.25, top_p=0.01),
    ]
    tokens, logprobs = sample_next_tokens(logits, params, torch.Generator().manual_seed(1))
    assert tokens.tolist() == [1, 0, 3]
    expected = [
        torch.log_softmax(logits[0], -1)[1],
        torch.log_softmax(logits[1] / 2.0, -1)[0],
        torch.log_softmax(logits[2] / 0.25, -1)[3],
    ]
    assert torch.allclose(logprobs, torch.stack(expected), atol=1e-6)


def test_banned_tokens_are_never_chosen_but_logprob_is_untouched():
    logits = torch.tensor([[5.0, 0.0, 0.0]] * 50)
    banned = [[0]] * 50
    tokens, logprobs = sample_next_tokens(
        logits, [SamplingParams(greedy=False)] * 49 + [SamplingParams(greedy=True)], torch.Generator(), banned
    )
    assert 0 not in tokens.tolist()
    assert torch.allclose(logprobs, torch.log_softmax(logits[0], -1)[1].expand(50), atol=1e-6)


def test_same_seed_same_draws():
    logits = PROBS.log().repeat(64, 1)
    t1, _ = sample_next_tokens(logits, [SamplingParams(greedy=False)] * 64, torch.Generator().manual_seed(3))
    t2, _ = sample_next_tokens(logits, [SamplingParams(greedy=False)] * 64, torch.Generator().manual_seed(3))
    assert t1.tolist() == t2.tolist()
    assert len(set(t1.tolist())) > 1  # really sampled, not a constant


def test_sampled_frequencies_follow_the_distribution():
    logits = PROBS.log().repeat(20000, 1)
    tokens, _ = sample_next_tokens(
        logits, [SamplingParams(greedy=False)] * 20000, torch.Generator().manual_seed(5)
    )
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    assert torch.allclose(freq, PROBS, atol=0.015), freq  # 4.5 standard errors of the largest share


def test_zero_probability_ids_at_the_edges_are_never_drawn():
    logits = torch.tensor([[float("-inf"), 0.0, 0.0, float("-inf")]]).repeat(5000, 1)
    tokens, _ = sample_next_tokens(
        logits, [SamplingParams(greedy=False)] * 5000, torch.Generator().manual_seed(0)
    )
    assert set(tokens.tolist()) == {1, 2}

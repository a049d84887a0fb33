"""`masked_token_logprobs`: the recomputed log-prob renormalised over a recorded allowed set."""

from __future__ import annotations

import math

import torch

from areal_nb.train.sampling_replay import masked_logprobs_from_hidden, masked_token_logprobs, mismatch_stats


def test_renormalises_over_the_allowed_set_and_leaves_full_rows_alone():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]).log()
    tokens = torch.tensor([0, 0])
    allowed = torch.tensor([[True, True, False, False], [True, True, True, True]])
    out = masked_token_logprobs(logits, tokens, allowed)
    assert math.isclose(float(out[0]), math.log(0.5 / 0.8), abs_tol=1e-6)  # top-2 nucleus: 0.5 of 0.8
    assert math.isclose(float(out[1]), math.log(0.5), abs_tol=1e-6)
    assert torch.equal(masked_token_logprobs(logits, tokens, None), torch.log_softmax(logits, -1)[:, 0])


def test_temperature_applies_before_the_mask():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    out = masked_token_logprobs(logits, torch.tensor([1]), torch.tensor([[True, True, False]]), temperature=0.5)
    assert math.isclose(float(out[0]), float(torch.log_softmax(torch.tensor([4.0, 2.0]), -1)[1]), abs_tol=1e-6)


def test_from_hidden_states_in_chunks_equals_the_logits_path():
    gen = torch.Generator().manual_seed(0)
    hidden, head = torch.randn(7, 16, generator=gen), torch.randn(40, 16, generator=gen)
    tokens = torch.randint(0, 40, (7,), generator=gen)
    allowed = torch.rand(7, 40, generator=gen) > 0.5
    allowed[torch.arange(7), tokens] = True
    expected = masked_token_logprobs(hidden @ head.T, tokens, allowed)
    assert torch.allclose(masked_logprobs_from_hidden(hidden, head, tokens, allowed, chunk=3), expected, atol=1e-6)


def test_mismatch_stats_count_ratios_outside_the_clip_range():
    stats = mismatch_stats(torch.tensor([0.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.1, -0.5, 0.3]), clip_eps=0.2)
    assert math.isclose(stats["mean_abs_logprob_diff"], 0.225, abs_tol=1e-6)
    assert stats["frac_ratio_outside_clip"] == 0.5  # exp(-0.5) = 0.61 and exp(0.3) = 1.35

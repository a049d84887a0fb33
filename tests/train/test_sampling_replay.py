"""`masked_token_logprobs`: the recomputed log-prob renormalised over a recorded allowed set."""

from __future__ import annotations

import math

import pytest
import torch

from areal_nb.train.sampling_replay import masked_logprobs_from_hidden, masked_token_logprobs, mismatch_stats
from tests.train.conftest import VOCAB


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


@pytest.mark.parametrize("chunk", [0, 3, 1024])
def test_the_trainers_forward_renormalises_the_indexed_tokens_only(tiny_qwen2, chunk):
    from areal_nb.train.logprobs import compute_token_logprobs_and_entropy

    ids = torch.randint(2, VOCAB, (2, 7))
    allowed = torch.rand(2, VOCAB) < 0.3
    allowed[0, ids[0, 4]] = allowed[1, ids[1, 6]] = True  # the sampled token is in its allowed set
    positions = torch.tensor([[0, 4], [1, 6]])
    with torch.no_grad():
        full, _ = compute_token_logprobs_and_entropy(tiny_qwen2, ids, None, 0.7, chunk=chunk)
        replayed, entropy = compute_token_logprobs_and_entropy(tiny_qwen2, ids, None, 0.7, chunk=chunk,
                                                               allowed=(positions, allowed))
        logits = tiny_qwen2(input_ids=ids).logits
    for k, (b, t) in enumerate(positions.tolist()):
        expected = masked_token_logprobs(logits[b, t - 1 : t], ids[b, t : t + 1], allowed[k : k + 1], 0.7)
        assert torch.allclose(replayed[b, t], expected[0], atol=1e-5)
        assert replayed[b, t] > full[b, t]  # the allowed set holds less than the whole mass
    others = torch.ones_like(full, dtype=torch.bool)
    others[positions[:, 0], positions[:, 1]] = False
    assert torch.allclose(replayed[others], full[others], atol=1e-6) and torch.isfinite(entropy).all()

"""`sample_next_tokens` with kept buffers (`VocabScratch`) chooses the same tokens and reports the
same log-probabilities, bit for bit, as without them, over batches that shrink and grow."""

from __future__ import annotations

import torch

from areal_nb.engine.sampling import SamplingParams, VocabScratch, sample_next_tokens

VOCAB = 1000


def _params(rows: int, kind: str) -> list[SamplingParams]:
    if kind == "t1":
        return [SamplingParams(greedy=False)] * rows
    if kind == "t0.7":
        return [SamplingParams(greedy=False, temperature=0.7)] * rows
    if kind == "mixed_t":
        return [SamplingParams(greedy=False, temperature=0.5 + 0.1 * (i % 5)) for i in range(rows)]
    if kind == "some_greedy":
        return [SamplingParams(greedy=i % 3 == 0) for i in range(rows)]
    return [SamplingParams(greedy=False, top_p=0.9, top_k=50)] * rows  # truncated


def test_kept_buffers_give_the_same_tokens_and_logprobs_bitwise():
    scratch = VocabScratch()
    plain_gen, scratch_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    data = torch.Generator().manual_seed(0)
    for rows in (16, 5, 16, 24, 3, 1, 24):  # shrinking views of one buffer, then growing past it
        for kind in ("t1", "t0.7", "mixed_t", "some_greedy", "truncated"):
            logits = torch.randn(rows, VOCAB, generator=data) * 3
            params = _params(rows, kind)
            banned = (
                [[1, 2] if i % 4 == 0 else [] for i in range(rows)] if kind == "t1" and rows > 4 else None
            )
            want = sample_next_tokens(logits, params, plain_gen, banned)
            got = sample_next_tokens(logits, params, scratch_gen, banned, scratch)
            assert torch.equal(got[0], want[0]), (rows, kind)
            assert torch.equal(got[1], want[1]), (rows, kind)  # exact, not close
    assert scratch._buffers  # the buffers were used and kept
    scratch.clear()
    assert not scratch._buffers


def test_results_do_not_alias_the_kept_buffers():
    scratch = VocabScratch()
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, VOCAB)
    tokens, logprobs = sample_next_tokens(logits, [SamplingParams(greedy=False)] * 8, gen, None, scratch)
    kept = logprobs.clone()
    sample_next_tokens(torch.randn(8, VOCAB), [SamplingParams(greedy=False)] * 8, gen, None, scratch)
    assert torch.equal(logprobs, kept)

"""The LM head run chunk by chunk (`lm_head.chunked_token_logprobs`) computes, per chunk, exactly
the plain formula: the same log-probs, entropy and gradients, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from areal_nb.train.lm_head import chunked_token_logprobs


def _plain(x, head, targets, temperature, chunk):
    """log_softmax(head(x) / temperature) read at `targets`, and the entropy, chunk by chunk."""
    picked, entropy = [], []
    for lo in range(0, len(x), chunk):
        log_probs = F.log_softmax(head(x[lo : lo + chunk]).float() / temperature, dim=-1)
        picked.append(log_probs.gather(-1, targets[lo : lo + chunk, None]).squeeze(-1))
        detached = log_probs.detach()
        entropy.append(-(detached.exp() * detached).sum(-1))
    return torch.cat(picked), torch.cat(entropy)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [12, 5])  # one chunk; checkpointed chunks
def test_chunks_equal_the_plain_log_softmax_bit_for_bit(temperature, chunk):
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=gen))
    x = torch.randn(12, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (12,), generator=gen)
    weights = torch.randn(12, generator=gen)
    got, got_entropy = chunked_token_logprobs(x, targets, temperature, chunk, project=head)
    want, want_entropy = _plain(x, head, targets, temperature, chunk)
    assert torch.equal(got, want) and torch.equal(got_entropy, want_entropy)
    got_grads = torch.autograd.grad((got * weights).sum(), (x, head.weight))
    want_grads = torch.autograd.grad((want * weights).sum(), (x, head.weight))
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads, strict=True))

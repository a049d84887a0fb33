"""The trainer on the sampler's distribution: log-probs renormalised over the recorded allowed sets.

A token sampled under a mask (a grammar, top-k, top-p) came from `softmax(logits / T)` restricted
to its allowed set and renormalised; its recorded log-prob (`SamplingMasks.logprobs`) is taken
under that distribution. A trainer that recomputes over the full vocabulary scores the same token
under another distribution, so π_behave and π_θ differ by the masked-out mass even with equal
weights. With `actor.replay_sampling_masks: true` the recomputed log-probs go through
`masked_token_logprobs` with the same allowed sets, before ratios, the decoupled loss and the
mismatch metrics.

The allowed sets come from `SamplingMasks.allowed` (the grammar replayed over the output, or the
recorded kept ids); `response_allowed` lays one response's sets out over its row of tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from areal_nb.api import ModelResponse


def masked_token_logprobs(logits: Tensor, tokens: Tensor, allowed: Tensor | None, temperature: float = 1.0) -> Tensor:
    """log p(tokens[t]) under `softmax(logits[t] / temperature)` restricted to `allowed[t]`.

    `logits` [T, V], `tokens` [T], `allowed` bool [T, V] (None: the full vocabulary). Positions
    whose allowed set is all True are the full-vocabulary log-prob exactly. Differentiable in
    `logits`.
    """
    scaled = logits.float() / temperature
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed.to(scaled.device), float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[..., None].long()).squeeze(-1)


def masked_logprobs_from_hidden(
    hidden: Tensor, lm_head: Tensor, tokens: Tensor, allowed: Tensor | None, temperature: float = 1.0, chunk: int = 1024
) -> Tensor:
    """`masked_token_logprobs` from last hidden states [T, H] and the output embedding [V, H],
    `chunk` positions at a time, so the [T, V] logits are never whole in memory."""
    parts = []
    for start in range(0, hidden.shape[0], chunk):
        end = start + chunk
        logits = hidden[start:end] @ lm_head.T
        parts.append(masked_token_logprobs(logits, tokens[start:end], None if allowed is None else allowed[start:end], temperature))
    return torch.cat(parts) if parts else hidden.new_zeros(0)


def response_allowed(response: ModelResponse, tokenizer: Any, vocab_size: int) -> Tensor | None:
    """bool [output_len, V]: each output token's allowed set (None: nothing was masked)."""
    masks = response.sampling_masks
    if masks is None:
        return None
    return masks.allowed(list(response.output_tokens), tokenizer, vocab_size)


def mismatch_stats(behave: Tensor, recomputed: Tensor, clip_eps: float = 0.2) -> dict[str, float]:
    """Engine vs trainer: mean |Δ log p| and the fraction of tokens whose ratio exp(Δ) leaves
    [1 - clip_eps, 1 + clip_eps]."""
    diff = (recomputed.float() - behave.float())
    ratio = diff.exp()
    outside = (ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)
    return {
        "mean_abs_logprob_diff": float(diff.abs().mean()) if diff.numel() else 0.0,
        "max_abs_logprob_diff": float(diff.abs().max()) if diff.numel() else 0.0,
        "frac_ratio_outside_clip": float(outside.float().mean()) if diff.numel() else 0.0,
    }

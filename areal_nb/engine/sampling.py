"""Next-token choice for a batch of rows that each have their own sampling parameters.

The reported log-probability of a token is `log_softmax(logits / temperature)` taken *before*
top-k/top-p truncation (SGLang's convention, and what the trainer recomputes); greedy rows report
plain `log_softmax(logits)`. Truncation only shapes the distribution that is sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling parameters, already validated (temperature > 0 unless greedy)."""

    greedy: bool
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k truncation

    def truncates(self, vocab_size: int) -> bool:
        return not self.greedy and (self.top_p < 1.0 or 0 < self.top_k < vocab_size)


def sample_next_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generator: torch.Generator | None = None,
    banned: list[list[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row of `logits` [B, V]; return (tokens [B] int64, logprobs [B] fp32).

    `banned[i]` lists token ids row i may not choose (used for `min_new_tokens`); they are removed
    from the sampling distribution but not from the reported log-probability.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(params)} rows")
    logits = logits.float()
    batch, vocab = logits.shape
    device = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=device)
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
    scaled = logits / temperature[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)

    choose_from = scaled
    if banned is not None and any(banned):
        choose_from = scaled.clone()
        for row, ids in enumerate(banned):
            if ids:
                choose_from[row, ids] = float("-inf")

    tokens = torch.empty(batch, dtype=torch.long, device=device)
    if bool(greedy.any()):
        tokens[greedy] = choose_from[greedy].argmax(dim=-1)
    sample_rows = (~greedy).nonzero(as_tuple=True)[0]
    if sample_rows.numel() > 0:
        sub_params = [params[i] for i in sample_rows.tolist()]
        if choose_from is scaled and not any(p.truncates(vocab) for p in sub_params):
            probs = logprobs_all[sample_rows].exp()  # the untruncated distribution: reuse log_softmax
        else:
            sub = choose_from[sample_rows]
            if any(p.truncates(vocab) for p in sub_params):
                sub = _truncate_top_k_top_p(sub, sub_params)
            probs = torch.softmax(sub, dim=-1)
        tokens[sample_rows] = torch.multinomial(probs, 1, generator=generator).squeeze(1)

    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def _truncate_top_k_top_p(scaled: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf (the best token always stays)."""
    vocab = scaled.shape[-1]
    device = scaled.device
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    remove = ranks >= top_k[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=device, dtype=scaled.dtype)
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= mass_before > top_p[:, None]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits)

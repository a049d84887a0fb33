"""Next-token choice for a batch of rows that each have their own sampling parameters.

The reported log-probability of a token is `log_softmax(logits / temperature)` taken *before*
top-k/top-p truncation (SGLang's convention, and what the trainer recomputes); greedy rows report
plain `log_softmax(logits)`. Truncation only shapes the distribution that is sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_nb.errors import BatchShapeError


@dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling parameters, already validated (temperature > 0 unless greedy)."""

    greedy: bool
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k truncation

    def truncates(self, vocab_size: int) -> bool:
        return not self.greedy and (self.top_p < 1.0 or 0 < self.top_k < vocab_size)


class VocabScratch:
    """Buffers [rows, V] kept between calls of `sample_next_tokens` for its full-vocabulary passes.

    At 128 rows of a 152k vocabulary each pass writes 78 MB. glibc serves blocks over 32 MiB from
    fresh mmap'd pages, which are faulted in and zeroed on every call: that tripled the sampling's
    CPU at 128 rows (0.14 s vs 0.04 s a step in one thread) while 32 rows (19 MB) reuse the heap.
    Writing into kept buffers computes the same values with the same kernels. The buffers hold
    the most rows seen (2-3 x rows x V floats) until `clear`.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of `like`'s shape [rows, V], dtype and device: buffer `name`'s
        first rows (a new buffer when the kept one is too small or differs)."""
        rows, vocab = like.shape
        buffer = self._buffers.get(name)
        if (
            buffer is None
            or buffer.shape[0] < rows
            or buffer.shape[1] != vocab
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            self._buffers.pop(name, None)  # free the old one before allocating its successor
            buffer = torch.empty_like(like)
            self._buffers[name] = buffer
        return buffer[:rows]

    def clear(self) -> None:
        self._buffers.clear()


def sample_next_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generator: torch.Generator | None = None,
    banned: list[list[int]] | None = None,
    scratch: VocabScratch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row of `logits` [B, V]; return (tokens [B] int64, logprobs [B] fp32).

    `banned[i]` lists token ids row i may not choose (used for `min_new_tokens`); they are removed
    from the sampling distribution but not from the reported log-probability. `scratch`: buffers
    for the [B, V] passes, kept by a caller that samples every step (the same results either way).
    """
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise BatchShapeError(f"logits shape {tuple(logits.shape)} does not match {len(params)} rows")
    logits = logits.float()
    batch, vocab = logits.shape
    device = logits.device
    # Per-step Python work and small tensor builds add up at ~100 steps/s: skip what is uniform.
    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    temperatures = {1.0 if p.greedy else p.temperature for p in params}
    if temperatures == {1.0}:
        scaled = logits
    elif len(temperatures) == 1:
        scaled = torch.div(logits, temperatures.pop(), out=_fresh(scratch, "scaled", logits))
    else:
        temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
        scaled = torch.div(logits, temperature[:, None], out=_fresh(scratch, "scaled", logits))
    logprobs_all = torch.log_softmax(scaled, dim=-1, out=_fresh(scratch, "logprobs", scaled))

    choose_from = scaled
    if banned is not None and any(banned):
        choose_from = scaled.clone()
        for row, ids in enumerate(banned):
            if ids:
                choose_from[row, ids] = float("-inf")

    if len(greedy_rows) == batch:
        tokens = choose_from.argmax(dim=-1)
    else:
        sample_rows = [i for i, p in enumerate(params) if not p.greedy]
        all_rows = len(sample_rows) == batch
        sub_params = params if all_rows else [params[i] for i in sample_rows]
        truncates = any(p.truncates(vocab) for p in sub_params)
        if choose_from is scaled and not truncates:
            # the untruncated distribution: reuse log_softmax
            if all_rows:
                probs = torch.exp(logprobs_all, out=_fresh(scratch, "probs", logprobs_all))
            else:
                probs = logprobs_all[sample_rows].exp()
        else:
            sub = choose_from if all_rows else choose_from[sample_rows]
            if truncates:
                sub = _truncate_top_k_top_p(sub, sub_params)
            probs = torch.softmax(sub, dim=-1)
        drawn = _inverse_cdf_draw(probs, generator)
        if all_rows:
            tokens = drawn
        else:
            tokens = choose_from.argmax(dim=-1)  # right for the greedy rows; sampled rows overwritten
            tokens[sample_rows] = drawn

    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def _fresh(scratch: VocabScratch | None, name: str, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor like `like`: from `scratch` when given, else a new one."""
    return torch.empty_like(like) if scratch is None else scratch.take(name, like)


def _inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [B, V] (rows need not sum to 1), from one uniform per row;
    `probs` is overwritten (every caller passes a temporary).

    `torch.multinomial` draws V exponentials per row on CPU, which dominated sampling; inverse
    transform sampling needs B uniforms. Zero-probability ids (banned, truncated) are never chosen:
    `searchsorted(right=True)` returns the first id whose cumulative mass exceeds the draw.
    """
    cdf = probs.cumsum_(dim=-1)  # in place: the same kernel and values as `cumsum`, no [B, V] block more
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, device=probs.device, dtype=probs.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u * total may round up to total
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


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


@dataclass
class MaskedChoice:
    """What `sample_masked` chose for a batch, and the distribution each row was sampled from."""

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] fp32, the full-distribution convention of `sample_next_tokens`
    sampled_logprobs: torch.Tensor  # [B] fp32, log-prob under the masked, renormalised distribution
    kept: list[list[int] | None]  # per row: the ids left by top-k / top-p / banned ids (None: not truncated)


def sample_masked(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generator: torch.Generator | None = None,
    banned: list[list[int]] | None = None,
    allowed: list[torch.Tensor | None] | None = None,
) -> MaskedChoice:
    """`sample_next_tokens` for rows that may carry a grammar mask (`allowed[i]`: bool [V]),
    recording each row's sampling distribution. Rows draw the same uniforms in the same order as
    `sample_next_tokens` (one per sampled row).

    The grammar mask is applied first, then the banned ids, then top-k / top-p within what is
    left (truncation never reaches outside the grammar). A row's kept set is recorded when
    truncation or banned ids changed its distribution beyond the grammar's own mask, which the
    trainer can replay instead of storing.
    """
    logits = logits.float()
    batch, vocab = logits.shape
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
    scaled = logits / temperature[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    choose_from = scaled.clone()
    for row in range(batch):
        mask = allowed[row] if allowed is not None else None
        if mask is not None:
            choose_from[row, ~mask.to(choose_from.device)] = float("-inf")
        if banned is not None and banned[row]:
            choose_from[row, banned[row]] = float("-inf")
    sample_rows = [i for i, p in enumerate(params) if not p.greedy]
    truncating = {i for i in sample_rows if params[i].truncates(vocab)}
    final = choose_from
    if truncating:
        rows = sorted(truncating)
        final = choose_from.clone()
        final[rows] = _truncate_top_k_top_p(choose_from[rows], [params[i] for i in rows])
    tokens = choose_from.argmax(dim=-1)
    if sample_rows:
        tokens[sample_rows] = _inverse_cdf_draw(torch.softmax(final[sample_rows], dim=-1), generator)
    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    sampled = torch.log_softmax(final, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    kept: list[list[int] | None] = []
    for row in range(batch):
        cut = row in truncating or (banned is not None and bool(banned[row]) and not params[row].greedy)
        kept.append(torch.isfinite(final[row]).nonzero().flatten().tolist() if cut else None)
    return MaskedChoice(tokens, logprobs, sampled, kept)

"""Micro-batches: consecutive rows of a minibatch, bounded by a row count and a token budget.

A micro-batch's activations grow with its tokens, not its rows: 8 rows of 4,000 tokens need
what 128 rows of 250 do. So rows join a micro-batch in order while both limits hold (the row
count `micro_batch_size`, the token budget `max_tokens_per_microbatch`, as AReaL's
`mb_spec.max_tokens_per_mb`); a row longer than the budget runs alone. In order, so the
gradients are summed in the same order as before and a row's group stays together when it fits.
"""

from __future__ import annotations

from torch import Tensor


def split_micro_batches(
    rows: Tensor, lengths: Tensor, max_rows: int | None, max_tokens: int | None
) -> list[Tensor]:
    """`rows` (indices into the batch) in micro-batches; `lengths[r]` is row r's token count."""
    if not len(rows):
        return []
    if max_tokens is None:
        return list(rows.split(max_rows or len(rows)))
    micros, start, tokens = [], 0, 0
    row_tokens = lengths[rows].tolist()
    for i, n in enumerate(row_tokens):
        full = (max_rows is not None and i - start >= max_rows) or tokens + n > max_tokens
        if i > start and full:
            micros.append(rows[start:i])
            start, tokens = i, 0
        tokens += n
    micros.append(rows[start:])
    return micros

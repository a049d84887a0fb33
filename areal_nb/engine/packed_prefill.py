"""`packed_prefill`: one forward over the new tokens of several prompts, without padding.

The prompts a scheduler iteration admits have different lengths (and, with the prefix cache,
different cached prefixes). Padding them to one length and running them as one batch computes the
padding too; splitting them into forwards over similar lengths (what the stock-forward path of
`kv_batch` does) pays the per-forward overhead once per group and joins the groups' caches with a
copy. Here every projection and MLP runs once over the packed tokens [T, hidden] (T = the new
tokens of all prompts, nothing else), and only attention, a small share of the arithmetic at these
lengths, runs on the rows' padded layout, which is where their keys/values must end up anyway: the
running batch's left-padded cache (`kv_batch.PaddedKVBatch`). So the keys/values are written
straight into their cache columns, with no join and no copy of the batch.

The arithmetic per token is `LeanForward.decode`'s (its `embed`, `qkv`, `mlp` and `logits`: the
same fused projections, norms and rotary table, for every family it covers), so the logits and keys/values equal a plain forward over each prompt alone up to
fp32 rounding (matmuls over a different number of rows may sum in another order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .lean_forward import LeanForward


def packed_prefill(
    lean: LeanForward,
    fed: list[list[int]],
    lengths: list[int],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
) -> torch.Tensor:
    """Compute the fed tokens of k rows; return each row's next-token logits [k, V].

    `keys`/`values`: per layer, the rows' cache columns [k, kv_heads, W, head_dim] (views into the
    batch's buffers are fine), W >= every `lengths[i]`. Row i's sequence of `lengths[i]` tokens is
    right-aligned in them (columns [W - lengths[i], W)); its first `lengths[i] - len(fed[i])`
    columns already hold its cached prefix, and the keys/values of its fed tokens `fed[i]` (the
    rest of the sequence, at least one token) are written into the last `len(fed[i])` columns.
    Columns left of the sequence are padding: never attended to.
    """
    device = keys[0].device
    rows, width = len(fed), keys[0].shape[2]
    counts = torch.tensor([len(f) for f in fed], device=device)
    total = torch.tensor(lengths, device=device)
    longest = int(counts.max())
    # each packed token's row, its column in the cache view, its slot in the [rows, longest] query grid
    row_of = torch.repeat_interleave(torch.arange(rows, device=device), counts)
    ends = torch.cumsum(counts, 0)
    within = torch.arange(int(ends[-1]), device=device) - (ends - counts)[row_of]  # 0.. count-1
    column = width - counts[row_of] + within
    slot = row_of * longest + (longest - counts[row_of] + within)
    positions = column - (width - total[row_of])  # position in the row's own sequence

    n_q = lean.n_heads
    ids = torch.tensor([t for f in fed for t in f], dtype=torch.long, device=device)
    hidden = lean.embed(ids)  # [T, hidden]
    cos, sin = lean.rope(hidden, positions)  # [T, 1, D]: one per token, every head
    # the query grid's columns are the view's last `longest` columns: a key is visible to a query
    # at or left of it and inside the row's sequence; a padding query sees its own column only
    # (its output is dropped, but a fully masked row would be NaN)
    q_col = torch.arange(width - longest, width, device=device)[:, None]
    k_col = torch.arange(width, device=device)[None, :]
    inside = k_col[None] >= (width - total)[:, None, None]  # [rows, 1, W]
    mask = (((k_col <= q_col)[None] & inside) | (k_col == q_col)[None])[:, None]  # [rows, 1, longest, W]
    for index, layer in enumerate(lean.weights()):  # the decoding steps' weights
        q, k, v = lean.qkv(layer, hidden, cos, sin)
        keys[index][row_of, :, column] = k
        values[index][row_of, :, column] = v
        grid = q.new_zeros(rows * longest, n_q, lean.head_dim)
        grid.index_copy_(0, slot, q)
        out = F.scaled_dot_product_attention(
            grid.view(rows, longest, n_q, lean.head_dim).transpose(1, 2),
            keys[index],
            values[index],
            attn_mask=mask,
            scale=1.0,  # q is scaled
            enable_gqa=lean.gqa,
        )
        out = out.transpose(1, 2).reshape(rows * longest, n_q * lean.head_dim).index_select(0, slot)
        hidden = hidden + layer.o(out)
        hidden = hidden + lean.mlp(layer, hidden)
    return lean.logits(hidden.index_select(0, ends - 1))

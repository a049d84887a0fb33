"""Training on unique tokens: rows that share a prefix are computed once (prefix sharing).

The 8 samples of a GRPO group repeat the same prompt, and the concat rows of one conversation
repeat its earlier turns. Instead of running every padded row through the model, the rows of a
pack (one group) are merged into a token trie: each distinct prefix is one node, stored once in
a packed sequence, with

- `position_ids` = the node's depth (= its position in every row that contains it), and
- a tree-shaped 4D attention mask: a node attends to its ancestors and itself, which is exactly
  the causal context it has in each of its rows.

So every node's hidden states equal those of the unshared computation, and the log-prob of a
row's token t is read from the logits of its parent node (the node of token t-1). Rows gather
those per-node values back into the usual `[B, L]` layout (`gather` sums the gradients of a node
shared by several rows), so the loss code, masks and advantages are unchanged and the loss and
gradients equal the padded computation up to float rounding.

Two layouts run the tries (`pack_rows(flat=...)`):
- flat (models on the Hugging Face attention interface, `tree_attention.supports_tree_attention`):
  all tries' nodes as one `[1, T]` sequence, no padding, attention only over each node's ancestors
  (`tree_attention.py`), and the LM head and log-softmax only at the nodes whose next-token
  log-prob is read (`positions`: the loss needs the generated tokens', not the prompt's);
- dense (any model): `[P, N]` sequences with the 4D tree mask above, batched by similar length.

This module builds the tries (`pack_rows`, a `PackedRows`); `packed_logprobs.py` runs them
(`packed_token_logprobs_and_entropy`, importable from here too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from .packed_logprobs import packed_token_logprobs_and_entropy  # noqa: F401 (re-exported)
from .packed_rows import PackedRows
from .tree_attention import plan_tree_attention

# Padding a batched forward may add to its real nodes (see `forward_groups`).
_PAD_SLACK = 0.125


def build_trie(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Merge token rows into a trie: (tokens, parents, depths, per-row node indices), parents first."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for row in rows:
        node, path = -1, []
        for depth, token in enumerate(row):
            key = (node, int(token))
            child = children.get(key)
            if child is None:
                child = children[key] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                depths.append(depth)
            node = child
            path.append(node)
        paths.append(path)
    return tokens, parents, depths, paths


def count_unique_tokens(input_ids: Tensor, attention_mask: Tensor) -> int:
    """Distinct prefixes over all rows (the nodes of one trie of the whole batch)."""
    lengths = attention_mask.sum(1).tolist()
    return len(build_trie([r[:n] for r, n in zip(input_ids.tolist(), lengths, strict=True)])[0])


def pack_rows(
    input_ids: Tensor,
    attention_mask: Tensor,
    pack_ids: Sequence[Any] | Tensor | None = None,
    flat: bool = False,
) -> PackedRows:
    """Pack right-padded rows `[B, L]` into tries laid out as `[P, N]` sequences.

    Rows with equal `pack_ids` (a GRPO group: its rows share their prompt) go into one trie
    (default: all rows). Then small tries are combined into one sequence, first-fit decreasing, up
    to the largest trie's size N: fewer padding nodes, and no sequence longer than it has to be
    (attention is dense over a sequence's N nodes). A sequence's trie is built over all its rows,
    so prefixes shared across their groups are stored once too.

    `flat=True` builds one trie of all rows instead (a single sequence has no padding for
    separate packs to save, and prefixes shared across groups, such as the chat template's opening,
    are stored once), plans its attention (`flat_nodes`, `plan`) and skips the dense layout's
    `tree_mask`; `packed_token_logprobs_and_entropy` runs the layout it finds.
    """
    n_rows, width = input_ids.shape
    lengths = attention_mask.sum(1).tolist()
    ids = input_ids.tolist()
    keys = [0] * n_rows if pack_ids is None else [_key(k) for k in pack_ids]
    if len(keys) != n_rows:
        raise InvalidArgumentError(f"pack_ids has {len(keys)} entries for {n_rows} rows")
    members: dict[Any, list[int]] = {}
    for row, key in enumerate(keys):
        members.setdefault(key, []).append(row)

    bins = [[row for rows in members.values() for row in rows]] if flat else _bins(members, ids, lengths)
    tries = [build_trie([ids[r][: lengths[r]] for r in rows]) for rows in bins]
    n = max(len(t[0]) for t in tries)
    n_packs = len(tries)
    tokens = torch.zeros(n_packs, n, dtype=torch.long)
    positions = torch.zeros(n_packs, n, dtype=torch.long)
    parents = torch.full((n_packs, n), -1, dtype=torch.long)
    node_of = torch.full((n_rows, width), -1, dtype=torch.long)
    for p, ((tok, par, dep, paths), rows) in enumerate(zip(tries, bins, strict=True)):
        k = len(tok)
        tokens[p, :k] = torch.tensor(tok)
        positions[p, :k] = torch.tensor(dep)
        parents[p, :k] = torch.tensor(par)
        for row, path in zip(rows, paths, strict=True):
            node_of[row, : len(path)] = torch.tensor(path) + p * n

    sequence_lengths = [len(t[0]) for t in tries]
    device = input_ids.device
    packed = PackedRows(
        input_ids=tokens.to(device),
        position_ids=positions.to(device),
        parents=parents.to(device),
        node_of=node_of.to(device),
        lengths=sequence_lengths,
        forwards=forward_groups(sequence_lengths),
    )
    if flat:
        offsets = [0]
        for k in sequence_lengths:
            offsets.append(offsets[-1] + k)
        packed.flat_nodes = torch.cat([p * n + torch.arange(k) for p, k in enumerate(sequence_lengths)]).to(
            device
        )
        packed.plan = plan_tree_attention(_segments(tries, offsets), offsets[-1]).to(device)
    else:
        packed.tree_mask = _ancestor_mask(parents, positions).to(device)
    return packed


def _bins(members: dict[Any, list[int]], ids: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """The rows of each dense sequence: packs' tries combined first-fit decreasing up to the
    largest one's size."""
    sizes = {key: len(build_trie([ids[r][: lengths[r]] for r in rows])[0]) for key, rows in members.items()}
    capacity = max(sizes.values())
    bins: list[list[int]] = []
    room: list[int] = []
    for key in sorted(members, key=lambda k: -sizes[k]):
        fit = next((i for i, free in enumerate(room) if free >= sizes[key]), None)
        if fit is None:
            bins.append([])
            room.append(capacity)
            fit = len(bins) - 1
        bins[fit].extend(members[key])
        room[fit] -= sizes[key]
    return bins


_Trie = tuple[
    list[int], list[int], list[int], list[list[int]]
]  # `build_trie`'s tokens, parents, depths, paths


def _segments(tries: list[_Trie], offsets: list[int]) -> list[tuple[list[int], int]]:
    """Each row's new nodes in its trie as (row path in flat node indices, index of the first new
    node): `build_trie` creates a row's new nodes after all earlier rows' nodes, as its path's tail."""
    segments = []
    for (_, _, _, paths), offset in zip(tries, offsets[:-1], strict=True):
        seen = -1  # the highest node of the earlier rows
        for path in paths:
            start = next((i for i in range(len(path) - 1, -1, -1) if path[i] <= seen), -1) + 1
            if start < len(path):
                segments.append(([offset + node for node in path], start))
                seen = path[-1]
    return segments


def _ancestor_mask(parents: Tensor, positions: Tensor) -> Tensor:
    """Ancestor-or-self mask `[P, N, N]`, built level by level: a node's row is its parent's row
    plus itself; padding nodes attend to themselves (no NaN)."""
    n_packs, n = parents.shape
    mask = torch.zeros(n_packs, n, n, dtype=torch.bool)
    mask[:, torch.arange(n), torch.arange(n)] = True
    real = parents >= 0
    for depth in range(1, int(positions.max()) + 1):
        pack, node = torch.nonzero(real & (positions == depth), as_tuple=True)
        mask[pack, node] |= mask[pack, parents[pack, node]]
    return mask


def forward_groups(lengths: Sequence[int], slack: float = _PAD_SLACK) -> list[list[int]]:
    """Sequences (indices) to run as one batched forward each, longest first: a sequence joins the
    current forward while the padding to the longest one stays within `slack` of the real nodes.

    One forward per sequence would pay the model's per-operation overhead for each of them (the
    8-sample groups of a small single-turn batch are ~50 nodes each: overhead dominates); one
    forward for all would pad every sequence to the longest. This keeps both small.
    """
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= (1 + slack) * (real + lengths[i]):
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return groups


def _key(value: Any) -> Any:
    return value.item() if isinstance(value, Tensor) else value

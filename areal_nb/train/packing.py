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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# Padding a batched forward may add to its real nodes (see `forward_groups`).
PAD_SLACK = 0.125


@dataclass
class PackedRows:
    """Rows merged into one token trie per pack, laid out as `[P, N]` packed sequences."""

    input_ids: Tensor  # [P, N] node tokens (0 on padding nodes)
    position_ids: Tensor  # [P, N] node depth
    parents: Tensor  # [P, N] index of the parent node within the pack, -1 for roots and padding
    tree_mask: Tensor  # [P, N, N] bool: node i attends to node j (ancestor or itself)
    node_of: Tensor  # [B, L] flat index (pack * N + node) of each row position, -1 on padding
    lengths: list[int]  # real nodes of each sequence (the rest is padding)
    forwards: list[list[int]]  # sequences run together as one [len, width] forward (`forward_groups`)

    @property
    def n_nodes(self) -> int:
        """Positions the model computes: each forward runs its sequences at the longest one's
        length, so this counts the few padding nodes that makes (at most `PAD_SLACK` extra)."""
        return sum(len(seqs) * self.lengths[seqs[0]] for seqs in self.forwards)


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


def pack_rows(input_ids: Tensor, attention_mask: Tensor, pack_ids: Sequence[Any] | Tensor | None = None) -> PackedRows:
    """Pack right-padded rows `[B, L]` into tries laid out as `[P, N]` sequences.

    Rows with equal `pack_ids` (a GRPO group: its rows share their prompt) go into one trie
    (default: all rows). Then small tries are combined into one sequence, first-fit decreasing, up
    to the largest trie's size N: fewer padding nodes, and no sequence longer than it has to be
    (attention is dense over a sequence's N nodes). A sequence's trie is built over all its rows,
    so prefixes shared across their groups are stored once too.
    """
    n_rows, width = input_ids.shape
    lengths = attention_mask.sum(1).tolist()
    ids = input_ids.tolist()
    keys = [0] * n_rows if pack_ids is None else [_key(k) for k in pack_ids]
    if len(keys) != n_rows:
        raise ValueError(f"pack_ids has {len(keys)} entries for {n_rows} rows")
    members: dict[Any, list[int]] = {}
    for row, key in enumerate(keys):
        members.setdefault(key, []).append(row)

    sizes = {key: len(build_trie([ids[r][: lengths[r]] for r in rows])[0]) for key, rows in members.items()}
    capacity = max(sizes.values())
    bins: list[list[int]] = []  # rows of each packed sequence
    room: list[int] = []
    for key in sorted(members, key=lambda k: -sizes[k]):
        fit = next((i for i, free in enumerate(room) if free >= sizes[key]), None)
        if fit is None:
            bins.append([])
            room.append(capacity)
            fit = len(bins) - 1
        bins[fit].extend(members[key])
        room[fit] -= sizes[key]
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

    # ancestor-or-self mask, built level by level: a node's row is its parent's row plus itself
    mask = torch.zeros(n_packs, n, n, dtype=torch.bool)
    mask[:, torch.arange(n), torch.arange(n)] = True  # padding nodes attend to themselves (no NaN)
    real = parents >= 0
    for depth in range(1, int(positions.max()) + 1):
        pack, node = torch.nonzero(real & (positions == depth), as_tuple=True)
        mask[pack, node] |= mask[pack, parents[pack, node]]
    sequence_lengths = [len(t[0]) for t in tries]
    return PackedRows(
        input_ids=tokens.to(input_ids.device),
        position_ids=positions.to(input_ids.device),
        parents=parents.to(input_ids.device),
        tree_mask=mask.to(input_ids.device),
        node_of=node_of.to(input_ids.device),
        lengths=sequence_lengths,
        forwards=forward_groups(sequence_lengths),
    )


def forward_groups(lengths: Sequence[int], slack: float = PAD_SLACK) -> list[list[int]]:
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


def packed_token_logprobs_and_entropy(
    model: torch.nn.Module, packed: PackedRows, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) `[B, L]` of the packed rows, in `logprobs.logits_to_token_logprobs`'s
    layout: position t holds log p(token_t | tokens_<t) under softmax(logits / temperature), position 0
    and padding hold 0."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = next(model.parameters()).dtype
    n = packed.input_ids.shape[1]
    device = packed.tree_mask.device
    node_lp, node_entropy, order = [], [], []
    # one forward per group of similar-length sequences, at the longest one's length k; a shorter
    # sequence's padding nodes (token 0, position 0) attend only to themselves and no real node
    # reads them, so the real nodes compute exactly what they would alone
    for seqs in packed.forwards:
        k = packed.lengths[seqs[0]]
        index = torch.tensor(seqs, device=device)
        additive = torch.zeros((len(seqs), 1, k, k), dtype=dtype, device=device)
        additive.masked_fill_(~packed.tree_mask[index, None, :k, :k], torch.finfo(dtype).min)
        tokens = packed.input_ids[index, :k]
        logits = model(
            input_ids=tokens,
            attention_mask=additive,  # a 4D mask is used as-is by sdpa/eager attention
            position_ids=packed.position_ids[index, :k],
            use_cache=False,
        ).logits
        log_probs = F.log_softmax(logits.float() / temperature, dim=-1)  # [s, k, V]
        parents = packed.parents[index, :k]
        has_parent = parents >= 0
        parents = parents.clamp(min=0)
        rows = torch.arange(len(seqs), device=device)[:, None]
        padding = log_probs.new_zeros(len(seqs), n - k)
        # a node's token log-prob is read at its parent's logits; roots have no context (0)
        lp = torch.where(has_parent, log_probs[rows, parents, tokens], 0.0)
        node_lp.append(torch.cat([lp, padding], dim=1))
        order.extend(seqs)
        if with_entropy:
            with torch.no_grad():  # reported, not trained on
                detached = log_probs.detach()
                entropy = -(detached.exp() * detached).sum(-1)
                node_entropy.append(torch.cat([torch.where(has_parent, entropy[rows, parents], 0.0), padding], dim=1))
    # back to pack order, flat: node_of indexes pack * N + node
    unsort = torch.empty(len(order), dtype=torch.long, device=device)
    unsort[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
    flat_lp = torch.cat(node_lp)[unsort].reshape(-1)
    if not with_entropy:
        return _to_rows(flat_lp, packed.node_of), None
    return _to_rows(flat_lp, packed.node_of), _to_rows(torch.cat(node_entropy)[unsort].reshape(-1), packed.node_of)


def _to_rows(per_node: Tensor, node_of: Tensor) -> Tensor:
    """Scatter per-node values back to each row's positions (0 on padding)."""
    valid = node_of >= 0
    return torch.where(valid, per_node[node_of.clamp(min=0)], 0.0)


def _key(value: Any) -> Any:
    return value.item() if isinstance(value, Tensor) else value

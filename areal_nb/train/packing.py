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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from ..api.attention_window import mask_by_layer_type, sliding_window
from .head_forward import head_hidden, supports_head_forward
from .lm_head import chunked_token_logprobs, split_head
from .tree_attention import TreePlan, plan_tree_attention, tree_attention

# Padding a batched forward may add to its real nodes (see `forward_groups`).
_PAD_SLACK = 0.125


@dataclass
class PackedRows:
    """Rows merged into one token trie per pack, laid out as `[P, N]` packed sequences."""

    input_ids: Tensor  # [P, N] node tokens (0 on padding nodes)
    position_ids: Tensor  # [P, N] node depth
    parents: Tensor  # [P, N] index of the parent node within the pack, -1 for roots and padding
    node_of: Tensor  # [B, L] flat index (pack * N + node) of each row position, -1 on padding
    lengths: list[int]  # real nodes of each sequence (the rest is padding)
    forwards: list[list[int]]  # sequences run together as one [len, width] forward (`forward_groups`)
    # dense layout: [P, N, N] bool, node i attends to node j (ancestor or itself)
    tree_mask: Tensor | None = None
    # flat layout: the real nodes (pack * N + node) in sequence order, and the attention plan
    flat_nodes: Tensor | None = None
    plan: TreePlan | None = None

    @property
    def n_nodes(self) -> int:
        """Positions the model computes. Flat: the tries' nodes. Dense: each forward runs its
        sequences at the longest one's length, so this counts the few padding nodes that makes (at
        most `_PAD_SLACK` extra)."""
        if self.flat_nodes is not None:
            return len(self.flat_nodes)
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


def packed_token_logprobs_and_entropy(
    model: torch.nn.Module,
    packed: PackedRows,
    temperature: float = 1.0,
    with_entropy: bool = True,
    positions: Tensor | None = None,
    last_layer_at_heads: bool = True,
    chunk: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) `[B, L]` of the packed rows, in `logprobs.logits_to_token_logprobs`'s
    layout: position t holds log p(token_t | tokens_<t) under softmax(logits / temperature), position 0
    and padding hold 0. With `positions` (bool `[B, L]`, e.g. the loss mask) only those positions
    are computed; the others hold 0 (the flat layout then runs the LM head on fewer nodes, and with
    `last_layer_at_heads` the last decoder layer's queries and MLP too: `head_forward.py`).
    `chunk` > 0: the LM head and log-softmax run that many tokens at a time (`lm_head.py`)."""
    if temperature <= 0:
        raise InvalidArgumentError(f"temperature must be > 0, got {temperature}")
    if packed.plan is not None:
        logprobs, entropy = _flat_logprobs(
            model, packed, temperature, with_entropy, positions, last_layer_at_heads, chunk
        )
    else:
        logprobs, entropy = _dense_logprobs(model, packed, temperature, with_entropy, chunk)
    if positions is not None:
        logprobs = torch.where(positions, logprobs, 0.0)
        entropy = None if entropy is None else torch.where(positions, entropy, 0.0)
    return logprobs, entropy


def _flat_logprobs(
    model: torch.nn.Module,
    packed: PackedRows,
    temperature: float,
    with_entropy: bool,
    positions: Tensor | None,
    last_layer_at_heads: bool = True,
    chunk: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """The flat layout: one `[1, T]` forward with tree attention, logits only where they are read."""
    assert packed.flat_nodes is not None and packed.plan is not None
    n_packs, n = packed.input_ids.shape
    device = packed.input_ids.device
    flat = packed.flat_nodes
    # pack * N + node -> index in the flat sequence
    compact = torch.full((n_packs * n,), -1, dtype=torch.long, device=device)
    compact[flat] = torch.arange(len(flat), device=device)
    tokens = packed.input_ids.reshape(-1)[flat]
    pack_start = torch.arange(n_packs, device=device)[:, None] * n
    parent_of = torch.where(packed.parents >= 0, packed.parents + pack_start, -1).reshape(-1)
    # the nodes whose token log-prob is read (those with a parent), and the nodes whose logits give it
    wanted = packed.node_of[packed.node_of >= 0 if positions is None else positions & (packed.node_of >= 0)]
    children = torch.unique(wanted)
    children = children[parent_of[children] >= 0]
    heads, head_of_child = torch.unique(compact[parent_of[children]], return_inverse=True)
    position_ids = packed.position_ids.reshape(-1)[flat]
    child_tokens = packed.input_ids.reshape(-1)[children]
    if chunk:
        lp, head_entropy = _flat_chunked(
            model,
            packed,
            tokens,
            position_ids,
            heads,
            compact,
            head_of_child,
            child_tokens,
            temperature,
            with_entropy,
            last_layer_at_heads,
            chunk,
        )
        logprobs = _to_rows(lp.new_zeros(n_packs * n).index_put((children,), lp), packed.node_of)
        entropy = None
        if head_entropy is not None:
            entropy = _to_rows(
                head_entropy.new_zeros(n_packs * n).index_put((children,), head_entropy), packed.node_of
            )
        return logprobs, entropy
    with tree_attention(model):
        if (
            last_layer_at_heads and len(heads) and supports_head_forward(model)
        ):  # the last layer at the heads only
            head_plan = plan_tree_attention(
                _head_runs(compact, packed.node_of, heads), len(flat), queries=heads.tolist()
            )
            logits = model.get_submodule("lm_head")(
                head_hidden(model, tokens, position_ids, packed.plan, heads, head_plan.to(device))
            )
        else:
            logits = model(
                input_ids=tokens[None],
                position_ids=position_ids[None],
                attention_mask={"full_attention": packed.plan},  # a prepared mask mapping is used as is
                tree_plan=packed.plan,  # (models that take no mapping: the attention reads it from here)
                use_cache=False,
                logits_to_keep=heads,  # a 1D index: the LM head runs at these positions only
            ).logits[0]  # [heads, V]
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)  # [heads, V]
    per_node = log_probs.new_zeros(n_packs * n).index_put((children,), log_probs[head_of_child, child_tokens])
    logprobs = _to_rows(per_node, packed.node_of)
    entropy = None
    if with_entropy:
        with torch.no_grad():  # reported, not trained on
            detached = log_probs.detach()
            head_entropy = -(detached.exp() * detached).sum(-1)
            per_node = head_entropy.new_zeros(n_packs * n).index_put((children,), head_entropy[head_of_child])
            entropy = _to_rows(per_node, packed.node_of)
    return logprobs, entropy  # (zeroed outside `positions` by the caller)


def _flat_chunked(
    model: torch.nn.Module,
    packed: PackedRows,
    tokens: Tensor,
    position_ids: Tensor,
    heads: Tensor,
    compact: Tensor,
    head_of_child: Tensor,
    child_tokens: Tensor,
    temperature: float,
    with_entropy: bool,
    last_layer_at_heads: bool,
    chunk: int,
) -> tuple[Tensor, Tensor | None]:
    """`_flat_logprobs`'s log-probs (and entropy) per read token, the LM head run `chunk` tokens
    at a time from the heads' final hidden states (`lm_head.py`)."""
    assert packed.plan is not None
    head = split_head(model)
    with tree_attention(model):
        if head is not None and last_layer_at_heads and len(heads) and supports_head_forward(model):
            head_plan = plan_tree_attention(
                _head_runs(compact, packed.node_of, heads), len(compact[compact >= 0]), queries=heads.tolist()
            )
            x = head_hidden(model, tokens, position_ids, packed.plan, heads, head_plan.to(tokens.device))
        elif head is not None:
            x = head.decoder(
                input_ids=tokens[None],
                position_ids=position_ids[None],
                attention_mask={"full_attention": packed.plan},
                tree_plan=packed.plan,
                use_cache=False,
            ).last_hidden_state[0, heads]
        else:
            x = model(
                input_ids=tokens[None],
                position_ids=position_ids[None],
                attention_mask={"full_attention": packed.plan},
                tree_plan=packed.plan,
                use_cache=False,
                logits_to_keep=heads,
            ).logits[0]
    # a head with several children (a branching point) is read once per child
    return chunked_token_logprobs(
        x[head_of_child],
        child_tokens,
        temperature,
        chunk,
        project=head.project if head else None,
        with_entropy=with_entropy,
    )


def _head_runs(compact: Tensor, node_of: Tensor, heads: Tensor) -> list[tuple[list[int], int, int]]:
    """`heads` (flat indices) as query runs (row path in flat indices, start, end) for
    `plan_tree_attention(queries=heads)`: a row's heads lie in runs along its path (the parents of
    a turn's generated tokens), and each head goes to the first row that has it."""
    n_rows = node_of.shape[0]
    rows_flat = torch.where(node_of >= 0, compact[node_of.clamp(min=0)], -1)  # [B, L]
    valid = rows_flat >= 0
    is_head = torch.zeros(len(compact), dtype=torch.bool, device=compact.device)
    is_head[heads] = True
    row_index = torch.arange(n_rows, device=compact.device)[:, None].expand_as(rows_flat)
    first_row = torch.full((len(compact),), n_rows, dtype=torch.long, device=compact.device)
    first_row.scatter_reduce_(0, rows_flat[valid], row_index[valid], "amin")
    takes = valid & is_head[rows_flat.clamp(min=0)] & (first_row[rows_flat.clamp(min=0)] == row_index)
    runs = []
    for row in torch.nonzero(takes.any(1)).flatten().tolist():
        path = rows_flat[row][valid[row]].tolist()
        take = takes[row, : len(path)].tolist()
        t = 0
        while t < len(path):
            if take[t]:
                start = t
                while t < len(path) and take[t]:
                    t += 1
                runs.append((path, start, t))
            else:
                t += 1
    return runs


def _dense_logprobs(
    model: torch.nn.Module,
    packed: PackedRows,
    temperature: float,
    with_entropy: bool,
    chunk: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """The dense layout: `[P, N]` sequences with the 4D tree mask, batched by similar length."""
    assert packed.tree_mask is not None
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
        additive = _dense_mask(model, packed.tree_mask[index, :k, :k], packed.position_ids[index, :k], dtype)
        tokens = packed.input_ids[index, :k]
        parents = packed.parents[index, :k]
        has_parent = parents >= 0
        parents = parents.clamp(min=0)
        rows = torch.arange(len(seqs), device=device)[:, None]
        padding = torch.zeros(len(seqs), n - k, device=device)
        head = split_head(model) if chunk else None
        out = (head.decoder if head else model)(
            input_ids=tokens,
            attention_mask=additive,  # a 4D mask is used as-is by sdpa/eager attention
            position_ids=packed.position_ids[index, :k],
            use_cache=False,
        )
        if chunk:  # the head `chunk` tokens at a time, at the nodes with a parent only
            x = (out.last_hidden_state if head else out.logits)[rows, parents][has_parent]
            lp, ent = chunked_token_logprobs(
                x,
                tokens[has_parent],
                temperature,
                chunk,
                project=head.project if head else None,
                with_entropy=with_entropy,
            )
            node_lp.append(
                torch.cat([lp.new_zeros(len(seqs), k).index_put((has_parent,), lp), padding], dim=1)
            )
            if ent is not None:
                node_entropy.append(
                    torch.cat([ent.new_zeros(len(seqs), k).index_put((has_parent,), ent), padding], dim=1)
                )
            order.extend(seqs)
            continue
        log_probs = F.log_softmax(out.logits.float() / temperature, dim=-1)  # [s, k, V]
        # a node's token log-prob is read at its parent's logits; roots have no context (0)
        lp = torch.where(has_parent, log_probs[rows, parents, tokens], 0.0)
        node_lp.append(torch.cat([lp, padding], dim=1))
        order.extend(seqs)
        if with_entropy:
            with torch.no_grad():  # reported, not trained on
                detached = log_probs.detach()
                entropy = -(detached.exp() * detached).sum(-1)
                node_entropy.append(
                    torch.cat([torch.where(has_parent, entropy[rows, parents], 0.0), padding], dim=1)
                )
    # back to pack order, flat: node_of indexes pack * N + node
    unsort = torch.empty(len(order), dtype=torch.long, device=device)
    unsort[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
    flat_lp = torch.cat(node_lp)[unsort].reshape(-1)
    if not with_entropy:
        return _to_rows(flat_lp, packed.node_of), None
    return _to_rows(flat_lp, packed.node_of), _to_rows(
        torch.cat(node_entropy)[unsort].reshape(-1), packed.node_of
    )


def _dense_mask(
    model: torch.nn.Module, tree: Tensor, depth: Tensor, dtype: torch.dtype
) -> Tensor | dict[str, Tensor]:
    """The additive 4D mask `[s, 1, k, k]` of tries `tree [s, k, k]` for `model`'s attention. A
    prepared mask is used as is, so a sliding window (Mistral's every layer; Gemma 3's and Qwen 3's
    `sliding_attention` layers, given a mask per layer type) is applied here: node i sees ancestor
    j only when their depths differ by less than the window, as in the model's own causal mask."""

    def additive(allowed: Tensor) -> Tensor:
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )[:, None]

    full = additive(tree)
    window = sliding_window(model.config)
    if window is None:
        return full
    windowed = additive(tree & ((depth[:, :, None] - depth[:, None, :]) < window))
    return mask_by_layer_type(model.config, full, windowed)


def _to_rows(per_node: Tensor, node_of: Tensor) -> Tensor:
    """Scatter per-node values back to each row's positions (0 on padding)."""
    valid = node_of >= 0
    return torch.where(valid, per_node[node_of.clamp(min=0)], 0.0)


def _key(value: Any) -> Any:
    return value.item() if isinstance(value, Tensor) else value

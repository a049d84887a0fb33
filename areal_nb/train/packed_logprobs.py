"""`packed_token_logprobs_and_entropy`: the model's log-probs (and entropy) of rows packed
into token tries (`packing.pack_rows`), back in the rows' `[B, L]` layout.

A row's token t is read from the logits of its parent node (the node of token t-1); the
per-node values are gathered back into the rows (`_to_rows`; a node shared by several rows
sums their gradients). The flat layout runs one `[1, T]` forward with tree attention and the LM
head only at the nodes whose next-token log-prob is read; the dense layout runs `[P, N]`
sequences with a 4D tree mask, batched by similar length (`PackedRows.forwards`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from ..api.attention_window import mask_by_layer_type, sliding_window
from .head_forward import head_hidden, supports_head_forward
from .lm_head import chunked_token_logprobs, split_head
from .packed_rows import PackedRows
from .tree_attention import plan_tree_attention, tree_attention


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


# One forward of the flat layout, from the index maps it needs to the per-row log-probs: the maps
# (`compact`, `children`, `heads`) are read by every step after them, so it stays one function.
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


# The dense layout's loop over its forwards, each turned into node log-probs and entropies, then
# put back in pack order: one pass whose lists (`node_lp`, `order`) tie the steps together.
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

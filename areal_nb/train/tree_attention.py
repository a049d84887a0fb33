"""Attention over a token trie in one flat sequence, computing only the (query, key) pairs it needs.

The prefix-shared forward (`packed_logprobs.py`) lays the nodes of its tries out as one `[1, T]` sequence.
A dense tree mask would make attention O(T²) over mostly masked pairs: a node sees only its
ancestors (its row's earlier tokens), a few hundred of the thousands of nodes. Here the nodes are
split into *segments*: the nodes a row added to the trie, consecutive in trie order. A segment's
keys are its row's path (ancestors, then itself), its queries the path's tail, and query i sees key
t when depth t <= depth i (causal along the path). Segments are cut into query chunks of at most
`CHUNK` nodes (a chunk's keys end at its last query), and chunks of similar key length run as one
batched `scaled_dot_product_attention` call over gathered keys: work ~ Σ chunk × its keys instead of
T². The softmax of each query runs over exactly its ancestors, as with the dense mask, so the
outputs equal the dense computation up to float rounding, gradients included (the gathers' backward
sums each key's gradient over the chunks that read it).

It plugs into Hugging Face models through their attention interface (`AttentionInterface`, the
documented extension point): `tree_attention(model)` switches the model to `_ATTENTION_NAME` for a
forward that passes a `TreePlan` as the attention mask (`{"full_attention": plan}`: models take a
prepared mask mapping as is) and as the `tree_plan` keyword, which the model hands down to its
attention (a model that builds its own mask from the mapping, such as Llama's, passes None as the mask). Backward needs no switch (autograd kept the functions).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

_ATTENTION_NAME = "areal_nb_tree"
CHUNK = 96  # queries per chunk: longer chunks pad more keys (a chunk's keys end at its last query)
_SLACK = 0.1  # padded work a batched call may add to the real (query, key) pairs of its chunks
_MIN_WORK = 16384  # pairs below which a call's overhead outweighs padding: chunks join regardless


@dataclass
class Bucket:
    """Chunks run as one batched attention call: n chunks of q_len query and k_len key slots."""

    mask: Tensor  # [n, 1, q_len, k_len] bool: query slot sees key slot
    n: int
    q_len: int
    k_len: int


@dataclass
class TreePlan:
    """How `tree_attention_forward` computes a flat trie's attention: the buckets, the nodes in
    their query and key slots (one gather each for all buckets: one gradient scatter in backward),
    and where each node's output lies among the query slots."""

    buckets: list[Bucket]
    query_nodes: Tensor  # [Σ n*q_len] node (query) of each query slot (padding slots repeat a real one)
    key_nodes: Tensor  # [Σ n*k_len] node of each key slot (padding slots: node 0, masked)
    output_slot: Tensor  # [T] query slot of each node (of each query, planned with `queries`)
    pairs: int  # (query, key) pairs computed, padding included (the dense mask: T² per sequence)

    def to(self, device: torch.device) -> TreePlan:
        buckets = [Bucket(b.mask.to(device), b.n, b.q_len, b.k_len) for b in self.buckets]
        return TreePlan(
            buckets,
            self.query_nodes.to(device),
            self.key_nodes.to(device),
            self.output_slot.to(device),
            self.pairs,
        )


def plan_tree_attention(
    segments: Sequence[tuple[Sequence[int], int] | tuple[Sequence[int], int, int]],
    n_nodes: int,
    chunk: int = CHUNK,
    slack: float = _SLACK,
    queries: Sequence[int] | None = None,
) -> TreePlan:
    """The plan for `n_nodes` nodes from their segments: (path, start), where `path` lists the node
    indices of a row root first (node path[t] has depth t) and the segment is path[start:]. Every
    node must be in exactly one segment.

    With `queries` only those nodes' outputs are computed (`head_forward.py`'s last layer): the
    segments are then (path, start, end), the queries path[start:end], each query in exactly one
    segment; the plan's query tensor holds the queries in `queries` order (its `query_nodes` and
    `output_slot` index that order), its keys and values stay those of all `n_nodes` nodes."""
    groups = _grouped(_chunks(segments, chunk), slack)
    buckets, key_nodes, query_slots = [], [], []
    query_nodes: list[int] = []
    slots = pairs = 0
    for group in groups:
        n, k_len = len(group), group[0][2]
        q_len = max(end - lo for _, lo, end in group)
        keys: list[int] = []
        for i, (path, lo, end) in enumerate(group):
            keys += path[:end]
            keys += [0] * (k_len - end)  # padding keys: depth >= end, which no query of the chunk sees
            query_nodes += path[lo:end]
            query_nodes += [path[lo]] * (q_len - end + lo)  # padding queries (their output is dropped)
            query_slots.append(range(slots + i * q_len, slots + i * q_len + end - lo))
        key_nodes.append(torch.tensor(keys, dtype=torch.long))
        los = torch.tensor([c[1] for c in group])
        ends = torch.tensor([c[2] for c in group])
        # query slot j of a chunk has depth lo + j (padding slots: the last real depth, so that they
        # see some key); key slot t has depth t and is seen from depth >= t
        query_depth = torch.minimum(los[:, None] + torch.arange(q_len), ends[:, None] - 1)
        mask = torch.arange(k_len) <= query_depth[:, :, None]
        buckets.append(Bucket(mask[:, None], n, q_len, k_len))
        slots += n * q_len
        pairs += n * q_len * k_len
    nodes = torch.tensor(query_nodes, dtype=torch.long)
    real_slots = torch.tensor([slot for chunk in query_slots for slot in chunk], dtype=torch.long)
    slot_of = torch.full((n_nodes,), -1, dtype=torch.long)
    slot_of[nodes[real_slots]] = real_slots
    all_keys = torch.cat(key_nodes) if key_nodes else torch.zeros(0, dtype=torch.long)
    if queries is None:
        if bool((slot_of < 0).any()):
            raise InvalidArgumentError("plan_tree_attention: some nodes are in no segment")
        return TreePlan(buckets, nodes, all_keys, slot_of, pairs)
    wanted = torch.as_tensor(queries, dtype=torch.long)
    index_of = torch.full((n_nodes,), -1, dtype=torch.long)
    index_of[wanted] = torch.arange(len(wanted))
    output_slot, query_index = slot_of[wanted], index_of[nodes]
    if bool((output_slot < 0).any()) or bool((query_index < 0).any()):
        raise InvalidArgumentError("plan_tree_attention: the segments' queries are not exactly `queries`")
    return TreePlan(buckets, query_index, all_keys, output_slot, pairs)


_Chunk = tuple[Sequence[int], int, int]  # (path, first query depth, end depth)


def _chunks(
    segments: Sequence[tuple[Sequence[int], int] | tuple[Sequence[int], int, int]], chunk: int
) -> list[_Chunk]:
    """Each segment's queries cut into chunks of at most `chunk` consecutive depths."""
    chunks: list[_Chunk] = []
    for segment in segments:
        path, start = segment[0], segment[1]
        stop = segment[2] if len(segment) > 2 else len(path)
        for lo in range(start, stop, chunk):
            chunks.append((path, lo, min(lo + chunk, stop)))
    return chunks


def _grouped(chunks: list[_Chunk], slack: float) -> list[list[_Chunk]]:
    """The chunks in groups, one batched attention call each (a group's first chunk has its longest keys)."""
    # longest keys first (a group's first chunk sets its key length); a chunk joins the first group
    # whose padded work stays within `slack` of its real work (or is small anyway)
    chunks = sorted(chunks, key=lambda c: -c[2])
    groups: list[list[_Chunk]] = []
    real: list[int] = []  # real (query, key) pairs of each group
    q_max: list[int] = []
    for c in chunks:
        q, work = c[2] - c[1], (c[2] - c[1]) * c[2]
        for g, group in enumerate(groups):
            q_new = max(q_max[g], q)
            if (len(group) + 1) * q_new * group[0][2] <= max((1 + slack) * (real[g] + work), _MIN_WORK):
                group.append(c)
                real[g] += work
                q_max[g] = q_new
                break
        else:
            groups.append([c])
            real.append(work)
            q_max.append(q)
    return groups


def tree_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: TreePlan | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """`AttentionInterface` function: query `[1, H, T, D]`, key/value `[1, Hkv, T, D]` of the flat
    trie, `attention_mask` its `TreePlan`; returns `[1, T, H, D]` like the sdpa function. (A plan
    made with `queries`: query `[1, H, Q, D]` of those nodes, output `[1, Q, H, D]`.)"""
    if not isinstance(attention_mask, TreePlan):  # a model that builds its own mask (Llama) passes None
        attention_mask = kwargs.get("tree_plan")  # type: ignore[assignment]
    if not isinstance(attention_mask, TreePlan):
        raise ArgumentTypeError(
            f"{_ATTENTION_NAME} attention needs a TreePlan mask, got {type(attention_mask).__name__}"
        )
    if kwargs.get("sliding_window") is not None:
        raise InvalidArgumentError(f"{_ATTENTION_NAME} attention has no sliding window")
    if kwargs.get("softcap") is not None:
        raise InvalidArgumentError(f"{_ATTENTION_NAME} attention has no soft-capping")
    if dropout:
        raise InvalidArgumentError(
            f"{_ATTENTION_NAME} attention has no dropout (the actor trains in eval mode)"
        )
    plan = attention_mask
    # [T, H, D] views; one gather each, then every bucket's slots are views of it
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    # (split, not slicing: its backward concatenates the parts' gradients once)
    q_parts = q.index_select(0, plan.query_nodes).split([b.n * b.q_len for b in plan.buckets])
    k_parts = k.index_select(0, plan.key_nodes).split([b.n * b.k_len for b in plan.buckets])
    v_parts = v.index_select(0, plan.key_nodes).split([b.n * b.k_len for b in plan.buckets])
    outputs = []
    for b, q_b, k_b, v_b in zip(plan.buckets, q_parts, k_parts, v_parts, strict=True):
        out = F.scaled_dot_product_attention(
            q_b.view(b.n, b.q_len, heads, dim).transpose(1, 2),
            k_b.view(b.n, b.k_len, kv_heads, dim).transpose(1, 2),
            v_b.view(b.n, b.k_len, kv_heads, dim).transpose(1, 2),
            attn_mask=b.mask,
            scale=scaling,
            enable_gqa=heads != kv_heads,
        )  # [n, H, Q, D]
        outputs.append(out.transpose(1, 2).reshape(b.n * b.q_len, heads, dim))
    return torch.cat(outputs).index_select(0, plan.output_slot).unsqueeze(0), None


def supports_tree_attention(model: torch.nn.Module) -> bool:
    """Whether `model` routes attention through the Hugging Face attention interface (its
    implementation can be switched) with full attention in every layer (no sliding window) and
    no soft-capping of the attention scores (Gemma 2). Others run the dense layout."""
    can_set = getattr(model, "_can_set_attn_implementation", None)
    config = getattr(model, "config", None)
    if can_set is None or config is None or not can_set():
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        all(t == "full_attention" for t in layer_types)
        and not getattr(config, "sliding_window", None)
        and not getattr(config, "attn_logit_softcapping", None)
    )


@contextlib.contextmanager
def tree_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run the forwards inside with `tree_attention_forward` (the previous implementation after)."""
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTENTION_NAME, tree_attention_forward)  # (idempotent)
    config: Any = model.config  # a transformers PretrainedConfig
    previous = config._attn_implementation
    config._attn_implementation = _ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous

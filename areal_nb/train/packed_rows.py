"""`PackedRows`: rows merged into token tries, the layout `packing.pack_rows` builds and
`packed_logprobs.packed_token_logprobs_and_entropy` runs."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .tree_attention import TreePlan


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
        most `packing.forward_groups`' slack extra)."""
        if self.flat_nodes is not None:
            return len(self.flat_nodes)
        return sum(len(seqs) * self.lengths[seqs[0]] for seqs in self.forwards)

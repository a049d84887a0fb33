"""`SlotLayer` and `SlotCache`: the preallocated key/value buffers behind `kv_batch.PaddedKVBatch`.

Each layer keeps its keys/values in buffers [row capacity, kv_heads, column capacity, head_dim].
The running rows are the buffers' first `rows` rows (a contiguous slice, which the decoding step's
matmuls need), their valid columns the first `end`; a decoding step writes the next column in place
(no re-concatenation of the whole cache, what the stock `DynamicLayer` does). The layout of rows
and padding within the buffers is `PaddedKVBatch`'s (see its module docstring). `JoiningRows` are
the rows one `PaddedKVBatch.prefill` adds to them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .prefix_cache import LayerKV

SPARE_COLUMNS = 32  # free columns allocated beyond the current length (a decoding step reads them too)


class SlotLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are the first `rows` rows and `end` columns of buffers
    [row capacity, kv_heads, column capacity, head_dim]; the rest of the buffers holds zeros."""

    # set by the first `load`/`adopt`: always tensors from then on (the stock layer starts at None)
    keys: torch.Tensor
    values: torch.Tensor
    _k: torch.Tensor
    _v: torch.Tensor
    rows: int
    _end: int

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        # one buffer for the first states (a prefill's) and the next decoding steps: growing it at
        # the first `append` and again at the first decoding step copied the whole cache twice
        self.load(key_states[:, :, :0], value_states[:, :, :0], spare=key_states.shape[2] + SPARE_COLUMNS)

    def load(self, keys: torch.Tensor, values: torch.Tensor, spare: int = SPARE_COLUMNS) -> None:
        """Replace the contents (copied into fresh buffers of these rows, with `spare` zero columns)."""
        self._k = torch.cat([keys, keys.new_zeros(*keys.shape[:2], spare, keys.shape[3])], dim=2)
        self._v = torch.cat([values, values.new_zeros(*values.shape[:2], spare, values.shape[3])], dim=2)
        self.rows, self._end = keys.shape[0], keys.shape[2]
        self._refresh()

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, rows: int, end: int) -> None:
        """Use these buffers as they are (no copy): rows [0, rows) and columns [0, end) valid."""
        self._k, self._v, self.rows, self._end = keys, values, rows, end
        self.device = keys.device
        self._refresh()

    @property
    def capacity(self) -> int:
        """Columns of the buffers."""
        return int(self._k.shape[2])

    @property
    def row_capacity(self) -> int:
        return int(self._k.shape[0])

    def reserve(self, new: int) -> None:
        """Make room for `new` more columns (grows the buffer when needed)."""
        if self._end + new > self._k.shape[2]:
            self.load(self.keys, self.values, spare=max(SPARE_COLUMNS, new))

    def append_column(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one decoding step's keys/values [B, kv_heads, D] into the next column (room made by
        `reserve`); return the rows' whole buffers, spare columns included (contiguous)."""
        k, v = self._k[: self.rows], self._v[: self.rows]
        k.select(2, self._end).copy_(key)
        v.select(2, self._end).copy_(value)
        self._end += 1
        self._refresh()
        return k, v

    def _refresh(self) -> None:
        self.keys = self._k[: self.rows, :, : self._end]
        self.values = self._v[: self.rows, :, : self._end]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append; return the valid keys/values (the stock `Cache` contract)."""
        self.append(key_states, value_states)
        return self.keys, self.values

    def append(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append; return the rows' whole buffers, spare columns included (see the module docstring)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[2]
        self.reserve(new)
        k, v = self._k[: self.rows], self._v[: self.rows]
        k[:, :, self._end : self._end + new] = key_states
        v[:, :, self._end : self._end + new] = value_states
        self._end += new
        self._refresh()
        return k, v


class SlotCache(Cache):
    """A transformers `Cache` of one `SlotLayer` per model layer; `slots` are its `layers`, typed."""

    def __init__(self, num_layers: int) -> None:
        self.slots = [SlotLayer() for _ in range(num_layers)]
        super().__init__(layers=list(self.slots))  # the same layer objects; the Cache never adds any


class JoiningRows(NamedTuple):
    """The rows one prefill adds: row i's prompt, the cached keys/values of its first `cached[i]`
    tokens (None: none), and the prompts computed once for rows that repeat one (a GRPO group's
    samples): `distinct` holds the first row of each distinct prompt, `source[i]` row i's index
    into `distinct`."""

    prompts: list[list[int]]
    prefixes: list[list[LayerKV] | None]
    cached: list[int]
    distinct: list[int]
    source: list[int]

"""`PaddedKVBatch`: the running batch of sequences and their shared, left-padded KV cache.

Layout: every row's tokens are right-aligned in a cache of `length` columns; row i has `pads[i]`
padding columns on the left. Attention masks are built here as explicit 4-D masks (boolean,
True = may attend, for prefill; additive float, -inf on padding, for a decoding step) and positions as explicit per-row `position_ids`, so a row computes exactly
what it would compute alone, unpadded: padding keys are always masked out, and padding *queries*
(during a left-padded prefill) attend only to themselves so that they stay finite (a fully
masked query row would turn into NaN keys/values in the next layer, and 0 * NaN poisons the
real rows).

Rows join with `prefill` (prompts of similar length run as one forward, see `length_groups`; the
new rows' cache is left-padded to the common length and concatenated on the batch axis) and leave with `keep_rows` (batch rows dropped, then padding columns no row needs
any more are trimmed). A joining row may bring the keys/values of its prompt's first tokens
(`prefix_cache`): they are loaded into the new rows' cache and only the rest of the prompt is
computed. `row_kv` copies a row's keys/values out (what the prefix cache keeps of finished rows). The KV tensors are transformers' own `DynamicCache` layers, whose
`.keys`/`.values` ([batch, kv_heads, seq, head_dim]) are rewritten in place on join/leave.

Each layer keeps its keys/values in a preallocated buffer with spare columns (`_SlotLayer`), so a
decode step writes one column instead of re-concatenating the whole cache (what the stock
`DynamicLayer` does, and the main per-step cost besides the matmuls on a small model). The buffer
stays contiguous, valid columns first, spare columns zero: a decoding step attends over the whole
buffer (spare columns masked out), because torch's CPU `bmm` over a column slice of a wider buffer
(batch stride != rows x cols) is slower than over the whole buffer: per layer ~1.8x at 32 and 128
rows, although it reads fewer bytes (measured with 2+ columns left out; a whole decoding step with
sliced attention was 1.1-1.3x slower at 4-128 rows). So left padding and spare columns are read
too: at 128 rows about 40 % of the attended columns (`benchmarks/decode_step.py`; docs/design.md
says why a layout bucketed by length did not pay either).
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from .prefix_cache import LayerKV
from .qwen2_fast import Qwen2FastForward

SPARE_COLUMNS = 32  # free columns allocated beyond the current length (a decoding step reads them too)


class _SlotLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are the first `end` columns of a contiguous buffer.

    Columns [end, capacity) are spare room for the next tokens and hold zeros (finite, so that a
    masked-out score stays exactly -inf and its weight exactly 0).
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        # one buffer for the first states (a prefill's) and the next decoding steps: growing it at
        # the first `append` and again at the first decoding step copied the whole cache twice
        self.load(key_states[:, :, :0], value_states[:, :, :0], spare=key_states.shape[2] + SPARE_COLUMNS)

    def load(self, keys: torch.Tensor, values: torch.Tensor, spare: int = SPARE_COLUMNS) -> None:
        """Replace the contents (copied into a fresh buffer with `spare` zero columns)."""
        self._k = torch.cat([keys, keys.new_zeros(*keys.shape[:2], spare, keys.shape[3])], dim=2)
        self._v = torch.cat([values, values.new_zeros(*values.shape[:2], spare, values.shape[3])], dim=2)
        self._end = keys.shape[2]
        self._refresh()

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, end: int) -> None:
        """Use these buffers as they are (no copy): valid columns [0, end), zeros after."""
        self._k, self._v, self._end = keys, values, end
        self.device = keys.device
        self._refresh()

    @property
    def capacity(self) -> int:
        return int(self._k.shape[2])

    def reserve(self, new: int) -> None:
        """Make room for `new` more columns (grows the buffer when needed)."""
        if self._end + new > self._k.shape[2]:
            self.load(self.keys, self.values, spare=max(SPARE_COLUMNS, new))

    def keep(self, index: torch.Tensor, trim: int) -> None:
        """Keep batch rows `index` and drop the first `trim` columns, with a single copy."""
        self._k = self._k[:, :, trim:].index_select(0, index)
        self._v = self._v[:, :, trim:].index_select(0, index)
        self._end -= trim
        self._refresh()

    def append_column(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one decoding step's keys/values [B, kv_heads, D] into the next column (room made by
        `reserve`); return the whole buffers, spare columns included."""
        self._k.select(2, self._end).copy_(key)
        self._v.select(2, self._end).copy_(value)
        self._end += 1
        self._refresh()
        return self._k, self._v

    def _refresh(self) -> None:
        self.keys = self._k[:, :, : self._end]
        self.values = self._v[:, :, : self._end]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append; return the valid keys/values (the stock `Cache` contract)."""
        self.append(key_states, value_states)
        return self.keys, self.values

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append; return the whole buffers, spare columns included (see the module docstring)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[2]
        self.reserve(new)
        self._k[:, :, self._end : self._end + new] = key_states
        self._v[:, :, self._end : self._end + new] = value_states
        self._end += new
        self._refresh()
        return self._k, self._v


def _new_cache(num_layers: int) -> Cache:
    return Cache(layers=[_SlotLayer() for _ in range(num_layers)])


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` in most model forwards.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class PaddedKVBatch:
    def __init__(self, model: PreTrainedModel, fast_forward: bool = True) -> None:
        """`fast_forward`: use `Qwen2FastForward` when the model supports it, else the stock forward."""
        self.model = model
        self.fast = Qwen2FastForward(model) if fast_forward and Qwen2FastForward.supports(model) else None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_kwarg = _cache_kwarg(model)
        self.num_layers = int(model.config.num_hidden_layers)
        self.cache: Cache | None = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0  # cache columns
        # (pads, width, length, mask, positions) of the latest decoding step, see `_step_inputs`
        self._last_step: tuple | None = None
        self.last_prefill_computed = 0  # positions the last `prefill`'s forwards computed (padding included)

    @property
    def size(self) -> int:
        return int(self.pads.shape[0])

    def clear(self) -> None:
        self.cache = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0

    def _forward(self, input_ids, mask, position_ids, cache) -> torch.Tensor:
        if self.fast is not None:
            return self.fast(input_ids, mask, position_ids, cache)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    def prefill(self, prompts: list[list[int]], prefixes: list[list[LayerKV] | None] | None = None) -> torch.Tensor:
        """Add `prompts` as new rows at the end of the batch; return their next-token logits [k, V].

        `prefixes[i]`, when given, holds the keys/values of the first m < len(prompts[i]) tokens of
        prompt i (per layer [kv_heads, m, head_dim], from `prefix_cache`): only the rest of that
        prompt runs through the model. Identical prompts are computed once. Prompts whose computed
        parts (their suffixes) have very different lengths run as separate forwards over groups of
        similar length (`length_groups`), so padding costs little compute; their caches are then
        joined.
        """
        prefixes = list(prefixes) if prefixes is not None else [None] * len(prompts)
        if len(prefixes) != len(prompts):
            raise ValueError(f"prefill got {len(prefixes)} prefixes for {len(prompts)} prompts")
        cached = [0 if kv is None else int(kv[0][0].shape[1]) for kv in prefixes]
        for prompt, m in zip(prompts, cached, strict=True):
            if not 0 <= m < len(prompt):
                raise ValueError(f"a cached prefix of {m} tokens for a prompt of {len(prompt)}: at least "
                                 "the last prompt token must be computed")
        self.last_prefill_computed = 0
        # Identical prompts (a GRPO group's samples) are computed once and copied to every row.
        first: dict[tuple[int, ...], int] = {}
        members: list[list[int]] = []  # output rows of each distinct prompt
        for row, prompt in enumerate(prompts):
            index = first.setdefault(tuple(prompt), len(members))
            if index == len(members):
                members.append([])
            members[index].append(row)
        distinct = [rows[0] for rows in members]
        groups = length_groups([len(prompts[i]) - cached[i] for i in distinct])
        if len(groups) == 1 and len(distinct) == len(prompts):
            new_cache, pads, width, logits = self._prefill_padded(prompts, prefixes)
            self._merge(new_cache, pads, width)
            return logits
        width = max(len(p) for p in prompts)
        logits: torch.Tensor | None = None
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for group in groups:
            rows = [distinct[i] for i in group]
            cache, _, group_width, group_logits = self._prefill_padded([prompts[i] for i in rows],
                                                                       [prefixes[i] for i in rows])
            # every output row of each computed prompt, and where its values are in the group
            out = [row for i in group for row in members[i]]
            src = [local for local, i in enumerate(group) for _ in members[i]]
            out_index = torch.tensor(out, dtype=torch.long, device=self.device)
            src_index = torch.tensor(src, dtype=torch.long, device=self.device)
            if logits is None:
                logits = group_logits.new_empty(len(prompts), group_logits.shape[1])
                # with the spare columns the next decoding steps write into: adopted as they are
                # below, so the first step does not copy the whole cache to grow it
                for layer in cache.layers:
                    batch, heads, _, dim = layer.keys.shape
                    keys.append(layer.keys.new_zeros(len(prompts), heads, width + SPARE_COLUMNS, dim))
                    values.append(layer.values.new_zeros(len(prompts), layer.values.shape[1], width + SPARE_COLUMNS,
                                                         layer.values.shape[3]))
            logits[out_index] = group_logits.index_select(0, src_index)
            for layer, k, v in zip(cache.layers, keys, values, strict=True):
                k[out_index, :, width - group_width : width] = layer.keys.index_select(0, src_index)
                v[out_index, :, width - group_width : width] = layer.values.index_select(0, src_index)
        joined = _new_cache(self.num_layers)
        for layer, k, v in zip(joined.layers, keys, values, strict=True):
            layer.adopt(k, v, width)
        pads = torch.tensor([width - len(p) for p in prompts], dtype=torch.long, device=self.device)
        self._merge(joined, pads, width)
        return logits

    def _prefill_padded(
        self, prompts: list[list[int]], prefixes: list[list[LayerKV] | None]
    ) -> tuple[Cache, torch.Tensor, int, torch.Tensor]:
        """One left-padded forward over `prompts`: (their cache, pads, width, next-token logits).

        Every row feeds its last `fed` tokens, `fed` the longest uncached suffix of the group (a row
        whose cached prefix is longer than it needs recomputes the rest: padding in the middle of
        a row would break the left-padded layout). The cached columns before them are loaded into
        the cache first, right-aligned at column `width - fed`, so each row's tokens stay
        contiguous and right-aligned as the batch expects.
        """
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        fed = max(n - (0 if kv is None else int(kv[0][0].shape[1])) for n, kv in zip(lengths, prefixes, strict=True))
        start = width - fed  # first fed column; columns before it come from the prefixes
        pads = torch.tensor([width - n for n in lengths], dtype=torch.long, device=self.device)
        ids = torch.zeros(len(prompts), fed, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            tail = prompt[max(len(prompt) - fed, 0) :]
            ids[row, fed - len(tail) :] = torch.tensor(tail, dtype=torch.long)
        new_cache = _new_cache(self.num_layers)
        if start > 0:
            self._load_prefixes(new_cache, prefixes, [n - fed for n in lengths], start)
        q = torch.arange(start, width, device=self.device)[:, None]
        kv = torch.arange(width, device=self.device)[None, :]
        valid_kv = kv[None] >= pads[:, None, None]  # [k, 1, width]
        mask = ((kv <= q)[None] & valid_kv) | (kv == q)[None]  # [k, fed, width]
        positions = (q.T - pads[:, None]).clamp(min=0)
        logits = self._forward(ids, mask[:, None], positions, new_cache)
        self.last_prefill_computed += len(prompts) * fed
        return new_cache, pads, width, logits

    def _load_prefixes(self, cache: Cache, prefixes: list[list[LayerKV] | None], used: list[int], start: int) -> None:
        """Fill `cache` with row i's first `used[i]` cached columns, right-aligned in `start` columns."""
        for index, layer in enumerate(cache.layers):
            like = next(kv for kv in prefixes if kv is not None)[index][0]
            keys = like.new_zeros(len(prefixes), like.shape[0], start, like.shape[2])
            values = torch.zeros_like(keys)
            for row, (kv, n) in enumerate(zip(prefixes, used, strict=True)):
                if n > 0:
                    keys[row, :, start - n :] = kv[index][0][:, :n]
                    values[row, :, start - n :] = kv[index][1][:, :n]
            layer.device = keys.device
            layer.load(keys, values)

    def row_kv(self, row: int) -> list[LayerKV]:
        """Copies of row `row`'s keys/values without padding, per layer [kv_heads, n, head_dim]."""
        pad = int(self.pads[row])
        return [(layer.keys[row, :, pad:].clone(), layer.values[row, :, pad:].clone()) for layer in self.cache.layers]

    def decode(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's last sampled token [B]; return next-token logits [B, V]."""
        if self.cache is None or last_tokens.shape[0] != self.size:
            raise RuntimeError(f"decode got {last_tokens.shape[0]} tokens for a batch of {self.size} rows")
        if self.fast is not None:
            layers = self.cache.layers
            if self.length >= layers[0].capacity:  # every layer has the same columns
                for layer in layers:
                    layer.reserve(1)
            mask, positions = self._step_inputs(layers[0].capacity)
            logits = self.fast.decode(last_tokens, mask, positions, layers)
            self.length += 1
            return logits
        width = self.length + 1
        cols = torch.arange(width, device=self.device)
        # additive float mask, built once per step: sdpa would convert a boolean one in every layer
        hidden = (cols[None, :] < self.pads[:, None]) | (cols > self.length)[None, :]
        mask = torch.zeros(hidden.shape, device=self.device, dtype=self.dtype).masked_fill_(hidden, float("-inf"))
        mask = mask[:, None, None, :]  # [B, 1, 1, width]
        positions = (self.length - self.pads)[:, None]
        logits = self._forward(last_tokens[:, None], mask, positions, self.cache)
        self.length += 1
        return logits

    def _step_inputs(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fast decoding step's additive mask [B * kv_heads, 1, width] and positions [B].

        The step attends over every allocated column: padding and spare columns are masked out.
        Built in full when the layout changed (rows joined or left: new `pads`; the buffer grew);
        otherwise the previous step's mask and positions move on by one column, two small
        in-place operations instead of about ten.
        """
        last = self._last_step
        if last is not None and last[0] is self.pads and last[1] == width and last[2] == self.length - 1:
            mask, positions = last[3], last[4]
            mask.select(2, self.length).zero_()  # the column this step writes becomes visible
            positions += 1
        else:
            cols = torch.arange(width, device=self.device)
            hidden = (cols[None, :] < self.pads[:, None]) | (cols > self.length)[None, :]
            mask = torch.zeros(hidden.shape, device=self.device, dtype=self.dtype).masked_fill_(hidden, float("-inf"))
            n_kv = self.fast.n_kv_heads
            mask = mask[:, None, None, :].expand(-1, n_kv, 1, -1).reshape(self.size * n_kv, 1, width)
            positions = self.length - self.pads
        self._last_step = (self.pads, width, self.length, mask, positions)
        return mask, positions

    def keep_rows(self, keep: list[int]) -> None:
        """Keep only the rows at indices `keep` (in that order); trim padding nobody needs."""
        if not keep:
            self.clear()
            return
        if len(keep) == self.size and keep == list(range(self.size)):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        pads = self.pads.index_select(0, index)
        trim = int(pads.min())
        for layer in self.cache.layers:
            layer.keep(index, trim)
        self.pads = pads - trim
        self.length -= trim

    def _merge(self, new_cache: Cache, new_pads: torch.Tensor, new_length: int) -> None:
        if self.cache is None:
            self.cache, self.pads, self.length = new_cache, new_pads, new_length
            return
        # one copy of every row into a fresh buffer that already has the spare columns
        length = max(self.length, new_length)
        for old, new in zip(self.cache.layers, new_cache.layers, strict=True):
            old.adopt(_stack_right_aligned(old.keys, new.keys, length), _stack_right_aligned(old.values, new.values, length),
                      length)
        self.pads = torch.cat([self.pads + (length - self.length), new_pads + (length - new_length)])
        self.length = length


def length_groups(lengths: list[int], max_waste: float = 0.25, max_tokens: int = 4096) -> list[list[int]]:
    """Split row indices into groups of similar length for prefill, longest first.

    A group closes when the next row would pad more than `max_waste` of the group's longest
    length, or when the group's padded size would pass `max_tokens` (big matmuls gain nothing
    more). Prompts of one length (a GRPO group's samples) stay one group.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            group = groups[-1]
            longest = lengths[group[0]]
            if lengths[i] >= (1 - max_waste) * longest and (len(group) + 1) * longest <= max_tokens:
                group.append(i)
                continue
        groups.append([i])
    return groups


def _stack_right_aligned(a: torch.Tensor, b: torch.Tensor, length: int, spare: int = SPARE_COLUMNS) -> torch.Tensor:
    """Concatenate [Ba, H, La, D] and [Bb, H, Lb, D] on the batch axis, left-padded to `length`,
    followed by `spare` zero columns."""
    out = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], length + spare, a.shape[3])
    out[: a.shape[0], :, length - a.shape[2] : length] = a
    out[a.shape[0] :, :, length - b.shape[2] : length] = b
    return out

"""`PaddedKVBatch`: the running batch of sequences and their shared, left-padded KV cache.

Layout: every row's tokens are right-aligned in a cache of `length` columns; row i has `pads[i]`
padding columns on the left. Attention masks are built here as explicit 4-D masks (boolean,
True = may attend, for prefill; additive float, -inf on padding, for a decoding step) and positions as explicit per-row `position_ids`, so a row computes exactly
what it would compute alone, unpadded: padding keys are always masked out, and padding *queries*
(during a left-padded prefill) attend only to themselves so that they stay finite (a fully
masked query row would turn into NaN keys/values in the next layer, and 0 * NaN poisons the
real rows).

Storage: each layer keeps its keys/values in preallocated buffers [row capacity, kv_heads,
column capacity, head_dim] (`_SlotLayer`). The running rows are the buffer's first `size` rows
(a contiguous slice, which the decoding step's matmuls need: torch's CPU `bmm` over a column
slice of a wider buffer is ~1.8x slower per attention at 32-128 rows although it reads fewer
bytes, `benchmarks/decode_step.py`), its valid columns the first `length`.
A running row's other columns hold zeros (finite, so a masked-out score stays exactly -inf and its
weight 0); rows beyond `size` hold anything (never read) until a joining row clears its row.
- A decoding step writes one column (spare columns: no re-concatenation of the whole cache, what
  the stock `DynamicLayer` does) and attends over the whole column capacity, spare columns masked
  (and left padding: at 128 rows ~40 % of the columns read; docs/guides/cpu-engine.md says why neither a
  trimmed view nor buffers bucketed by length paid for reading less).
- Rows join (`prefill`) in the spare rows, right-aligned at `length`, when they fit there: the
  running rows are not touched. Only when they do not (more rows than the capacity, a prompt
  longer than `length`) are the running rows copied, once, into larger buffers (rows double).
- Rows leave (`keep_rows`) by moving the last rows into the freed slots (`compact_order` gives
  the order that moves fewest): no copy of the rows that stay in place. Padding columns no row
  needs any more are trimmed lazily: when a copy happens anyway, or when they reach a quarter of
  the columns (the decoding steps read them, so a one-time copy pays for itself within a few steps).

With the lean forward (`lean_forward`: Llama, Mistral, Qwen2, Qwen3, Gemma), the new rows' prompts
run as one forward over their packed tokens (`packed_prefill`) whose keys/values are written
straight into their cache columns; with the stock forward, prompts of similar length run as one padded forward each (`length_groups`) and are
copied in. Identical prompts (a GRPO group's samples) are computed once. A joining row may bring
the keys/values of its prompt's first tokens (`prefix_cache`): they are loaded into its columns and
only the rest of the prompt is computed. `rows_kv` copies rows' keys/values out (what the prefix
cache keeps of finished rows).
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from areal_nb.errors import BatchShapeError

from ..api.attention_window import mask_by_layer_type, sliding_window
from .lean_forward import LeanForward
from .packed_prefill import packed_prefill
from .prefix_cache import LayerKV

PREFILL_TOKENS = 1024  # tokens per packed prefill forward (see `token_chunks`)
RESERVE_TOKENS = 16384  # a new buffer has rows for at least this many tokens (see `_row_capacity`)
HEADROOM_COLUMNS = 16  # padding columns left of a joining prompt that made the batch wider (see `_make_room`)
SPARE_COLUMNS = 32  # free columns allocated beyond the current length (a decoding step reads them too)


class _SlotLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are the first `rows` rows and `end` columns of buffers
    [row capacity, kv_heads, column capacity, head_dim]; the rest of the buffers holds zeros."""

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

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
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


def _new_cache(num_layers: int) -> Cache:
    return Cache(layers=[_SlotLayer() for _ in range(num_layers)])


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` in most model forwards.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class PaddedKVBatch:
    def __init__(
        self, model: PreTrainedModel, fast_forward: bool = True, max_rows: int | None = None
    ) -> None:
        """`fast_forward`: use `LeanForward` when the model supports it, else the stock forward.
        `max_rows`: the most rows the owner will run at once (growing doubles the row capacity up
        to it, not past it)."""
        self.model = model
        self.fast = LeanForward(model) if fast_forward and LeanForward.supports(model) else None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_kwarg = _cache_kwarg(model)
        # the stock forward takes our masks as they are: its sliding window must be in them, and
        # its eager attention (soft-capped scores) adds them, so they must be additive there
        self.window = sliding_window(model.config)
        self._additive_only = model.config._attn_implementation != "sdpa"
        self.num_layers = int(model.config.num_hidden_layers)
        self.max_rows = max_rows
        self.cache: Cache | None = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0  # cache columns
        # (pads, width, length, mask, positions) of the latest decoding step, see `_step_inputs`
        self._last_step: tuple | None = None
        self.last_prefill_computed = 0  # positions the last `prefill`'s forwards computed (padding included)
        self.prefill_tokens = PREFILL_TOKENS
        self.relayouts = 0  # copies of the running rows into new buffers (for tests and benchmarks)

    @property
    def size(self) -> int:
        return int(self.pads.shape[0])

    def clear(self) -> None:
        self.cache = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0

    def _stock_mask(self, allowed: torch.Tensor, distance: torch.Tensor, additive: bool):
        """The stock forward's prepared mask from `allowed` (bool, True = may attend) and each
        query-key pair's `distance` in positions: the window applied where the model's layers
        slide, additive (0 / -inf in the model's dtype) when asked or when its attention needs it."""

        def prepared(keep: torch.Tensor) -> torch.Tensor:
            if not (additive or self._additive_only):
                return keep
            return torch.zeros(keep.shape, device=self.device, dtype=self.dtype).masked_fill_(
                ~keep, float("-inf")
            )

        if self.window is None:
            return prepared(allowed)
        windowed = prepared(allowed & (distance < self.window))
        return mask_by_layer_type(self.model.config, prepared(allowed), windowed)

    def _forward(self, input_ids, mask, position_ids, cache) -> torch.Tensor:
        """The stock forward (models without `LeanForward`): next-token logits [B, V]."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    # ------------------------------------------------------------------ joining

    def prefill(
        self, prompts: list[list[int]], prefixes: list[list[LayerKV] | None] | None = None
    ) -> torch.Tensor:
        """Add `prompts` as new rows at the end of the batch; return their next-token logits [k, V].

        `prefixes[i]`, when given, holds the keys/values of the first m < len(prompts[i]) tokens of
        prompt i (per layer [kv_heads, m, head_dim], from `prefix_cache`): only the rest of that
        prompt runs through the model. Identical prompts are computed once.
        """
        prefixes = list(prefixes) if prefixes is not None else [None] * len(prompts)
        if len(prefixes) != len(prompts):
            raise BatchShapeError(f"prefill got {len(prefixes)} prefixes for {len(prompts)} prompts")
        if not prompts:
            raise BatchShapeError("prefill got no prompts")
        cached = [0 if kv is None else int(kv[0][0].shape[1]) for kv in prefixes]
        for prompt, m in zip(prompts, cached, strict=True):
            if not 0 <= m < len(prompt):
                raise BatchShapeError(
                    f"a cached prefix of {m} tokens for a prompt of {len(prompt)}: at least "
                    "the last prompt token must be computed"
                )
        self.last_prefill_computed = 0
        # Identical prompts (a GRPO group's samples) are computed once and copied to every row.
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(prompt), len(first)) for prompt in prompts]  # row -> distinct index
        distinct = [0] * len(first)
        for row in reversed(range(len(prompts))):
            distinct[source[row]] = row  # the first row of each distinct prompt
        if self.fast is not None:
            return self._prefill_packed(prompts, prefixes, cached, distinct, source)
        return self._prefill_stock(prompts, prefixes, cached, distinct, source)

    def _prefill_packed(self, prompts, prefixes, cached, distinct, source) -> torch.Tensor:
        """The lean forward: `packed_prefill` over every distinct prompt's uncached tokens, in
        forwards of at most `prefill_tokens` tokens (measured on the 6.4 M benchmark model, 128
        prompts: 0.78x the CPU of one forward over all 4,600 tokens, whose [T, intermediate]
        activations no longer stay in cache), writing their keys/values into the new rows' columns
        (a scratch buffer first when some prompts repeat, copied to every row that repeats them)."""
        width = max(len(p) for p in prompts)
        start = self._make_room(len(prompts), width, self.fast.n_kv_heads, self.fast.head_dim)
        layers = self.cache.layers
        if len(distinct) == len(prompts):
            for layer in layers:  # what earlier rows left there
                layer._k[start : start + len(prompts)].zero_()
                layer._v[start : start + len(prompts)].zero_()
            cols = slice(self.length - width, self.length)
            keys = [layer._k[start : start + len(prompts), :, cols] for layer in layers]
            values = [layer._v[start : start + len(prompts), :, cols] for layer in layers]
        else:
            like = layers[0]._k
            keys = [like.new_zeros(len(distinct), like.shape[1], width, like.shape[3]) for _ in layers]
            values = [torch.zeros_like(k) for k in keys]
        for i, row in enumerate(distinct):
            if cached[row]:
                offset = width - len(prompts[row])
                for index, (k, v) in enumerate(prefixes[row]):
                    keys[index][i, :, offset : offset + cached[row]] = k[:, : cached[row]]
                    values[index][i, :, offset : offset + cached[row]] = v[:, : cached[row]]
        fed = [prompts[row][cached[row] :] for row in distinct]
        lengths = [len(prompts[row]) for row in distinct]
        parts = []
        for first, last in token_chunks([len(f) for f in fed], self.prefill_tokens):
            cols = slice(width - max(lengths[first:last]), width)  # attention over this part's columns only
            parts.append(
                packed_prefill(
                    self.fast,
                    fed[first:last],
                    lengths[first:last],
                    [k[first:last, :, cols] for k in keys],
                    [v[first:last, :, cols] for v in values],
                )
            )
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        self.last_prefill_computed = sum(len(f) for f in fed)
        if len(distinct) != len(prompts):
            self._place(start, keys, values, source)
            logits = logits.index_select(0, torch.tensor(source, dtype=torch.long, device=self.device))
        self._add_rows(
            torch.tensor([self.length - len(p) for p in prompts], dtype=torch.long, device=self.device)
        )
        return logits

    def _prefill_stock(self, prompts, prefixes, cached, distinct, source) -> torch.Tensor:
        """The stock forward: distinct prompts whose computed parts (suffixes) have very different
        lengths run as separate padded forwards over groups of similar length (`length_groups`), so
        padding costs little compute; their keys/values are then copied into the new rows."""
        width = max(len(p) for p in prompts)
        groups = length_groups([len(prompts[row]) - cached[row] for row in distinct])
        out_rows: list[list[int]] = [[] for _ in distinct]  # the rows of each distinct prompt
        for row, i in enumerate(source):
            out_rows[i].append(row)
        logits: torch.Tensor | None = None
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for group in groups:
            rows = [distinct[i] for i in group]
            cache, _, group_width, group_logits = self._prefill_padded(
                [prompts[r] for r in rows], [prefixes[r] for r in rows]
            )
            # every output row of each computed prompt, and where its values are in the group
            out = torch.tensor(
                [row for i in group for row in out_rows[i]], dtype=torch.long, device=self.device
            )
            src = torch.tensor(
                [local for local, i in enumerate(group) for _ in out_rows[i]],
                dtype=torch.long,
                device=self.device,
            )
            if logits is None:
                logits = group_logits.new_empty(len(prompts), group_logits.shape[1])
                for layer in cache.layers:
                    keys.append(
                        layer.keys.new_zeros(len(prompts), layer.keys.shape[1], width, layer.keys.shape[3])
                    )
                    values.append(
                        layer.values.new_zeros(
                            len(prompts), layer.values.shape[1], width, layer.values.shape[3]
                        )
                    )
            logits[out] = group_logits.index_select(0, src)
            for layer, k, v in zip(cache.layers, keys, values, strict=True):
                k[out, :, width - group_width :] = layer.keys.index_select(0, src)
                v[out, :, width - group_width :] = layer.values.index_select(0, src)
        start = self._make_room(len(prompts), width, keys[0].shape[1], keys[0].shape[3])
        self._place(start, keys, values)
        self._add_rows(
            torch.tensor([self.length - len(p) for p in prompts], dtype=torch.long, device=self.device)
        )
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
        fed = max(
            n - (0 if kv is None else int(kv[0][0].shape[1])) for n, kv in zip(lengths, prefixes, strict=True)
        )
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
        allowed = ((kv <= q)[None] & valid_kv) | (kv == q)[None]  # [k, fed, width]
        mask = self._stock_mask(allowed[:, None], (q - kv)[None, None], additive=False)
        positions = (q.T - pads[:, None]).clamp(min=0)
        logits = self._forward(ids, mask, positions, new_cache)
        self.last_prefill_computed += len(prompts) * fed
        return new_cache, pads, width, logits

    def _load_prefixes(
        self, cache: Cache, prefixes: list[list[LayerKV] | None], used: list[int], start: int
    ) -> None:
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

    def _make_room(self, rows: int, width: int, heads: int, dim: int) -> int:
        """Make room for `rows` new rows of up to `width` columns, right-aligned at `self.length`;
        return their first row (its contents are undefined: the caller clears it)."""
        if self.cache is None or not self.size:
            self.cache = _new_cache(self.num_layers)
            capacity = self._row_capacity(rows, width + SPARE_COLUMNS)
            for layer in self.cache.layers:
                buffers = [
                    torch.empty(
                        capacity, heads, width + SPARE_COLUMNS, dim, device=self.device, dtype=self.dtype
                    )
                    for _ in range(2)
                ]
                layer.adopt(*buffers, rows=0, end=width)
            self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
            self.length = width
            return 0
        layer = self.cache.layers[0]
        if self.size + rows <= layer.row_capacity and width <= self.length:
            return self.size
        trim = int(self.pads.min())  # padding columns no running row needs
        length = self.length - trim
        if width > length:
            # left headroom: the next prompts a little longer than this one (a multi-turn batch's
            # next turns) join in place instead of copying the batch again; the decoding steps read
            # these columns too, but a copy of the batch costs about two steps
            length = width + HEADROOM_COLUMNS
        capacity = layer.row_capacity
        if self.size + rows > capacity:
            capacity = self._row_capacity(self.size + rows, length + SPARE_COLUMNS)
        self._relayout(capacity, trim, length)
        return self.size

    def _row_capacity(self, needed: int, columns: int) -> int:
        """Rows for new buffers of `columns` columns that must hold `needed`: twice that, or enough
        for `RESERVE_TOKENS` tokens if more (so a stream of admissions copies the batch a few
        times, not once per admission), but not past `max_rows` (unless needed)."""
        wanted = max(2 * needed, RESERVE_TOKENS // max(columns, 1))
        return max(needed, min(wanted, self.max_rows or wanted))

    def _relayout(self, row_capacity: int, trim: int, length: int, spare: int = SPARE_COLUMNS) -> None:
        """Copy the running rows, less their first `trim` columns, right-aligned into new buffers of
        `row_capacity` rows and `length + spare` columns (the rows beyond are left uncleared: not
        read until a joining row clears them; filling a buffer of zeros cost as much as the copy)."""
        kept = self.length - trim
        for layer in self.cache.layers:
            buffers = []
            for old in (layer._k, layer._v):
                new = old.new_empty(row_capacity, old.shape[1], length + spare, old.shape[3])
                new[: self.size, :, : length - kept].zero_()
                new[: self.size, :, length - kept : length] = old[: self.size, :, trim : self.length]
                new[: self.size, :, length:].zero_()
                buffers.append(new)
            layer.adopt(*buffers, rows=self.size, end=length)
        self.pads = self.pads + (length - kept - trim)  # a new tensor: `_step_inputs` sees the change
        self.length = length
        self.relayouts += 1

    def _place(
        self,
        start: int,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        source: list[int] | None = None,
    ) -> None:
        """Copy new rows' keys/values into rows [start, start + k), right-aligned at `self.length`,
        clearing what earlier rows left in those rows. `keys`/`values`: per layer [k, kv_heads, w, D],
        or with `source` (row j of the new rows gets computed row source[j]) the computed rows only.

        A run of rows with one source (a GRPO group's samples) is one broadcast copy: no gathered
        temporary of every row, whose fresh memory cost as much as the copy itself.
        """
        rows, width = (keys[0].shape[0] if source is None else len(source)), keys[0].shape[2]
        runs, first = [], 0  # (first row, last row + 1, source row), or one run of every row
        for j in range(1, rows + 1):
            if source is None:
                runs = [(0, rows, None)]
                break
            if j == rows or source[j] != source[first]:
                runs.append((first, j, source[first]))
                first = j
        for layer, k, v in zip(self.cache.layers, keys, values, strict=True):
            for buffer, new in ((layer._k, k), (layer._v, v)):
                target = buffer[start : start + rows]
                target[:, :, : self.length - width].zero_()
                target[:, :, self.length :].zero_()
                for a, b, i in runs:
                    target[a:b, :, self.length - width : self.length] = new if i is None else new[i : i + 1]

    def _add_rows(self, pads: torch.Tensor) -> None:
        self.pads = torch.cat([self.pads, pads])
        for layer in self.cache.layers:
            layer.adopt(layer._k, layer._v, rows=self.size, end=self.length)

    # ------------------------------------------------------------------ reading rows out

    def row_kv(self, row: int) -> list[LayerKV]:
        """Copies of row `row`'s keys/values without padding, per layer [kv_heads, n, head_dim]."""
        return self.rows_kv([row])[0]

    def rows_kv(self, rows: list[int]) -> list[list[LayerKV]]:
        """Copies of rows' keys/values without padding, per row and layer [kv_heads, n, head_dim].

        One copy per row and layer of exactly its columns: gathering all rows in one block per layer
        was slower (an `index_select` over a column slice takes a slow path) and copied padding.
        """
        pads = self.pads.tolist()
        return [
            [
                (
                    layer._k[row, :, pads[row] : self.length].clone(),
                    layer._v[row, :, pads[row] : self.length].clone(),
                )
                for layer in self.cache.layers
            ]
            for row in rows
        ]

    # ------------------------------------------------------------------ decoding

    def _reserve_column(self) -> None:
        """Room for one more column: when the buffers are full, copy the rows (less the padding no
        row needs) into buffers with `SPARE_COLUMNS` more."""
        if self.length >= self.cache.layers[0].capacity:
            trim = int(self.pads.min())
            self._relayout(self.cache.layers[0].row_capacity, trim, self.length - trim)

    def decode(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's last sampled token [B]; return next-token logits [B, V]."""
        if self.cache is None or last_tokens.shape[0] != self.size:
            raise BatchShapeError(f"decode got {last_tokens.shape[0]} tokens for a batch of {self.size} rows")
        self._reserve_column()
        if self.fast is not None:
            layers = self.cache.layers
            mask, positions = self._step_inputs(layers[0].capacity)
            logits = self.fast.decode(last_tokens, mask, positions, layers)
            self.length += 1
            return logits
        width = self.length + 1
        cols = torch.arange(width, device=self.device)
        # additive float mask, built once per step: sdpa would convert a boolean one in every layer
        allowed = (cols[None, :] >= self.pads[:, None]) & (cols <= self.length)[None, :]
        mask = self._stock_mask(
            allowed[:, None, None, :], self.length - cols, additive=True
        )  # [B, 1, 1, width]
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
            mask = torch.zeros(hidden.shape, device=self.device, dtype=self.dtype).masked_fill_(
                hidden, float("-inf")
            )
            n_kv = self.fast.n_kv_heads
            mask = mask[:, None, None, :].expand(-1, n_kv, 1, -1).reshape(self.size * n_kv, 1, width)
            positions = self.length - self.pads
        self._last_step = (self.pads, width, self.length, mask, positions)
        return mask, positions

    # ------------------------------------------------------------------ leaving

    def keep_rows(self, keep: list[int]) -> None:
        """Keep only the rows at indices `keep` (row j becomes old row keep[j]).

        Only rows that change slot are copied (`compact_order` orders `keep` so that the fewest
        do); padding columns no row needs are trimmed when they reach a quarter of the columns.
        """
        if not keep:
            self.clear()
            return
        if len(keep) == self.size and keep == list(range(self.size)):
            return
        moved = [j for j, old in enumerate(keep) if old != j]
        if moved:
            target = torch.tensor(moved, dtype=torch.long, device=self.device)
            origin = torch.tensor([keep[j] for j in moved], dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                for buffer in (layer._k, layer._v):
                    buffer.index_copy_(
                        0, target, buffer.index_select(0, origin)
                    )  # a copy first: slots may overlap
        left = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.pads = self.pads.index_select(0, left)
        for layer in self.cache.layers:
            layer.adopt(layer._k, layer._v, rows=len(keep), end=self.length)
        trim = int(self.pads.min())
        if trim >= max(SPARE_COLUMNS, self.length // 4):
            self._relayout(self.cache.layers[0].row_capacity, trim, self.length - trim)


def token_chunks(counts: list[int], budget: int) -> list[tuple[int, int]]:
    """Split rows into consecutive ranges [first, last) of at most `budget` tokens (a row longer
    than the budget is a range of its own)."""
    ranges, first, total = [], 0, 0
    for row, n in enumerate(counts):
        if total and total + n > budget:
            ranges.append((first, row))
            first, total = row, 0
        total += n
    ranges.append((first, len(counts)))
    return ranges


def compact_order(keep: list[int]) -> list[int]:
    """The order of the staying rows `keep` (ascending) for `PaddedKVBatch.keep_rows` that moves
    the fewest: rows already in the first len(keep) slots stay, the rows beyond fill the holes."""
    n = len(keep)
    staying = set(keep)
    beyond = iter(row for row in keep if row >= n)
    return [row if row in staying else next(beyond) for row in range(n)]


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

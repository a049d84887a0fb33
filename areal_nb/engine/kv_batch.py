"""`PaddedKVBatch`: the running batch of sequences and their shared, left-padded KV cache.

Layout: every row's tokens are right-aligned in a cache of `length` columns; row i has `pads[i]`
padding columns on the left. Every forward gets explicit attention masks and per-row positions,
so a row computes exactly what it would compute alone, unpadded (`stock_forward` says how for the
model's own forward; the lean forward's decoding step masks padding and spare columns additively).

Storage: each layer keeps its keys/values in preallocated buffers [row capacity, kv_heads,
column capacity, head_dim] (`kv_slots.SlotLayer`). The running rows are the buffer's first `size` rows
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
straight into their cache columns; with the stock forward (`stock_forward`), prompts of similar
length run as one padded forward each (`length_groups`) and are copied in. Identical prompts (a GRPO group's samples) are computed once. A joining row may bring
the keys/values of its prompt's first tokens (`prefix_cache`): they are loaded into its columns and
only the rest of the prompt is computed. `rows_kv` copies rows' keys/values out (what the prefix
cache keeps of finished rows).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from areal_nb.errors import BatchShapeError, CallOrderError

from .kv_slots import SPARE_COLUMNS, JoiningRows, SlotCache, SlotLayer
from .lean_forward import LeanForward
from .packed_prefill import packed_prefill
from .prefix_cache import LayerKV
from .stock_forward import StockForward, length_groups

__all__ = ["SPARE_COLUMNS", "JoiningRows", "PaddedKVBatch", "compact_order", "length_groups", "token_chunks"]

PREFILL_TOKENS = 1024  # most tokens per packed prefill forward (see `token_chunks`, `prefill_token_budget`)
# most bytes of a packed prefill's widest activation, the fused gate|up output [T, 2 x intermediate]
PREFILL_ACTIVATION_BYTES = 20 * 2**20
RESERVE_TOKENS = 16384  # a new buffer has rows for at least this many tokens (see `_row_capacity`)
HEADROOM_COLUMNS = 16  # padding columns left of a joining prompt that made the batch wider (see `_make_room`)


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
        self.stock = StockForward(model, self.device, self.dtype)
        self.window = self.stock.window  # the model's sliding window (None: none)
        self.num_layers = self.stock.num_layers
        self.max_rows = max_rows
        self.cache: SlotCache | None = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0  # cache columns
        # (pads, width, length, mask, positions) of the latest decoding step, see `_step_inputs`
        self._last_step: tuple[torch.Tensor, int, int, torch.Tensor, torch.Tensor] | None = None
        self.last_prefill_computed = 0  # positions the last `prefill`'s forwards computed (padding included)
        self.prefill_tokens = prefill_token_budget(model.config, self.dtype)
        self.relayouts = 0  # copies of the running rows into new buffers (for tests and benchmarks)

    @property
    def size(self) -> int:
        return int(self.pads.shape[0])

    def clear(self) -> None:
        self.cache = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0

    @property
    def _slots(self) -> list[SlotLayer]:
        """The cache's layers; only while the batch has a cache (rows, or rows about to join)."""
        if self.cache is None:
            raise CallOrderError("the batch has no cache: no rows were added since it was cleared")
        return self.cache.slots

    def _lean(self) -> LeanForward:
        if self.fast is None:
            raise CallOrderError("this batch runs the stock forward: it has no lean forward")
        return self.fast

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
        rows = JoiningRows(prompts, prefixes, cached, distinct, source)
        return self._prefill_packed(rows) if self.fast is not None else self._prefill_stock(rows)

    def _prefill_packed(self, rows: JoiningRows) -> torch.Tensor:
        """The lean forward: `packed_prefill` over every distinct prompt's uncached tokens, in
        forwards of at most `prefill_tokens` tokens (measured on the 6.4 M benchmark model, 128
        prompts: 0.78x the CPU of one forward over all 4,600 tokens, whose [T, intermediate]
        activations no longer stay in cache), writing their keys/values into the new rows' columns
        (a scratch buffer first when some prompts repeat, copied to every row that repeats them)."""
        prompts, prefixes, cached, distinct, source = rows
        lean = self._lean()
        width = max(len(p) for p in prompts)
        start = self._make_room(len(prompts), width, lean.n_kv_heads, lean.head_dim)
        layers = self._slots
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
            prefix = prefixes[row]
            if prefix is not None and cached[row]:
                offset = width - len(prompts[row])
                for index, (k, v) in enumerate(prefix):
                    keys[index][i, :, offset : offset + cached[row]] = k[:, : cached[row]]
                    values[index][i, :, offset : offset + cached[row]] = v[:, : cached[row]]
        fed = [prompts[row][cached[row] :] for row in distinct]
        lengths = [len(prompts[row]) for row in distinct]
        parts = []
        for first, last in token_chunks([len(f) for f in fed], self.prefill_tokens):
            cols = slice(width - max(lengths[first:last]), width)  # attention over this part's columns only
            parts.append(
                packed_prefill(
                    lean,
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

    def _prefill_stock(self, rows: JoiningRows) -> torch.Tensor:
        """The stock forward (`StockForward.prefill`: padded forwards over groups of prompts of
        similar length); their keys/values are then copied into the new rows."""
        prompts = rows.prompts
        width = max(len(p) for p in prompts)
        keys, values, logits, computed = self.stock.prefill(rows)
        self.last_prefill_computed += computed
        start = self._make_room(len(prompts), width, keys[0].shape[1], keys[0].shape[3])
        self._place(start, keys, values)
        self._add_rows(
            torch.tensor([self.length - len(p) for p in prompts], dtype=torch.long, device=self.device)
        )
        return logits

    def _make_room(self, rows: int, width: int, heads: int, dim: int) -> int:
        """Make room for `rows` new rows of up to `width` columns, right-aligned at `self.length`;
        return their first row (its contents are undefined: the caller clears it)."""
        if self.cache is None or not self.size:
            self.cache = SlotCache(self.num_layers)
            capacity = self._row_capacity(rows, width + SPARE_COLUMNS)
            for layer in self.cache.slots:
                buffers = [
                    torch.empty(
                        capacity, heads, width + SPARE_COLUMNS, dim, device=self.device, dtype=self.dtype
                    )
                    for _ in range(2)
                ]
                layer.adopt(buffers[0], buffers[1], rows=0, end=width)
            self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
            self.length = width
            return 0
        layer = self._slots[0]
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
        for layer in self._slots:
            buffers = []
            for old in (layer._k, layer._v):
                new = old.new_empty(row_capacity, old.shape[1], length + spare, old.shape[3])
                new[: self.size, :, : length - kept].zero_()
                new[: self.size, :, length - kept : length] = old[: self.size, :, trim : self.length]
                new[: self.size, :, length:].zero_()
                buffers.append(new)
            layer.adopt(buffers[0], buffers[1], rows=self.size, end=length)
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
        runs: list[
            tuple[int, int, int | None]
        ] = []  # (first row, last row + 1, source row), or one run of every row
        first = 0
        for j in range(1, rows + 1):
            if source is None:
                runs = [(0, rows, None)]
                break
            if j == rows or source[j] != source[first]:
                runs.append((first, j, source[first]))
                first = j
        for layer, k, v in zip(self._slots, keys, values, strict=True):
            for buffer, new in ((layer._k, k), (layer._v, v)):
                target = buffer[start : start + rows]
                target[:, :, : self.length - width].zero_()
                target[:, :, self.length :].zero_()
                for a, b, i in runs:
                    target[a:b, :, self.length - width : self.length] = new if i is None else new[i : i + 1]

    def _add_rows(self, pads: torch.Tensor) -> None:
        self.pads = torch.cat([self.pads, pads])
        for layer in self._slots:
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
                for layer in self._slots
            ]
            for row in rows
        ]

    # ------------------------------------------------------------------ decoding

    def _reserve_column(self) -> None:
        """Room for one more column: when the buffers are full, copy the rows (less the padding no
        row needs) into buffers with `SPARE_COLUMNS` more."""
        if self.length >= self._slots[0].capacity:
            trim = int(self.pads.min())
            self._relayout(self._slots[0].row_capacity, trim, self.length - trim)

    def decode(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's last sampled token [B]; return next-token logits [B, V]."""
        if self.cache is None or last_tokens.shape[0] != self.size:
            raise BatchShapeError(f"decode got {last_tokens.shape[0]} tokens for a batch of {self.size} rows")
        self._reserve_column()
        if self.fast is not None:
            layers = self.cache.slots
            mask, positions = self._step_inputs(layers[0].capacity)
            logits = self.fast.decode(last_tokens, mask, positions, layers)
        else:
            logits = self.stock.decode(last_tokens, self.pads, self.length, self.cache)
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
            n_kv = self._lean().n_kv_heads
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
            for layer in self._slots:
                for buffer in (layer._k, layer._v):
                    buffer.index_copy_(
                        0, target, buffer.index_select(0, origin)
                    )  # a copy first: slots may overlap
        left = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.pads = self.pads.index_select(0, left)
        for layer in self._slots:
            layer.adopt(layer._k, layer._v, rows=len(keep), end=self.length)
        trim = int(self.pads.min())
        if trim >= max(SPARE_COLUMNS, self.length // 4):
            self._relayout(self._slots[0].row_capacity, trim, self.length - trim)


def prefill_token_budget(config: object, dtype: torch.dtype) -> int:
    """Tokens per packed prefill forward: `PREFILL_TOKENS`, fewer where the fused gate|up output of
    that many tokens would pass `PREFILL_ACTIVATION_BYTES`.

    glibc serves blocks over 32 MiB from fresh mmap'd pages, faulted in and zeroed at every layer
    of every forward; below that the heap reuses them. Qwen2.5-0.5B's shape in float32 (38 KiB a
    token) got 538 tokens: its prefill of 128 prompts took 0.85-0.9x the CPU of 1,024-token
    forwards (one thread). Small models (SmolLM2: 12 KiB a token) keep 1,024.
    """
    intermediate = int(getattr(config, "intermediate_size", 0) or 0)
    if intermediate <= 0:
        return PREFILL_TOKENS
    per_token = 2 * intermediate * dtype.itemsize
    return max(1, min(PREFILL_TOKENS, PREFILL_ACTIVATION_BYTES // per_token))


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

"""`StockForward`: the model's own transformers forward, run the way `kv_batch.PaddedKVBatch`
needs it, for the models the lean forward (`lean_forward`) does not cover.

The batch is left-padded, so every forward gets explicit 4-D attention masks (boolean, True = may
attend, for a prefill; additive float, -inf on padding, for a decoding step) and explicit per-row
`position_ids`: a row computes exactly what it would compute alone, unpadded. Padding keys are
always masked out, and padding *queries* (during a left-padded prefill) attend only to themselves
so that they stay finite (a fully masked query row would turn into NaN keys/values in the next
layer, and 0 * NaN poisons the real rows). The masks carry the model's sliding window where its
layers slide, and are additive where its attention needs that (eager, soft-capped scores).

Prompts of similar length run as one padded forward each (`length_groups`); their keys/values are
returned for the batch to copy into its rows.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from areal_nb.errors import BatchShapeError

from ..api.attention_window import mask_by_layer_type, sliding_window
from .kv_slots import JoiningRows, SlotCache
from .prefix_cache import LayerKV


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` in most model forwards.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class StockForward:
    def __init__(self, model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.device, self.dtype = device, dtype
        self._cache_kwarg = _cache_kwarg(model)
        # the stock forward takes our masks as they are: its sliding window must be in them, and
        # its eager attention (soft-capped scores) adds them, so they must be additive there
        self.window = sliding_window(model.config)
        self._additive_only = model.config._attn_implementation != "sdpa"
        self.num_layers = int(model.config.num_hidden_layers)

    def mask(self, allowed: torch.Tensor, distance: torch.Tensor, additive: bool) -> torch.Tensor | dict:
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

    def forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | dict,
        position_ids: torch.Tensor,
        cache: SlotCache,
    ) -> torch.Tensor:
        """Next-token logits [B, V] of the model's own forward."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    def decode(
        self, last_tokens: torch.Tensor, pads: torch.Tensor, length: int, cache: SlotCache
    ) -> torch.Tensor:
        """One decoding step over rows with `pads` left padding columns in `length` columns: each
        row's last token [B] in; next-token logits [B, V] out (its keys/values land in `cache`)."""
        width = length + 1
        cols = torch.arange(width, device=self.device)
        # additive float mask, built once per step: sdpa would convert a boolean one in every layer
        allowed = (cols[None, :] >= pads[:, None]) & (cols <= length)[None, :]
        mask = self.mask(allowed[:, None, None, :], length - cols, additive=True)  # [B, 1, 1, width]
        positions = (length - pads)[:, None]
        return self.forward(last_tokens[:, None], mask, positions, cache)

    def prefill(self, rows: JoiningRows) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, int]:
        """Distinct prompts whose computed parts (suffixes) have very different lengths run as
        separate padded forwards over groups of similar length (`length_groups`), so padding costs
        little compute. Returns every row's keys and values (per layer [k, kv_heads, width, D],
        right-aligned), its next-token logits and the positions the forwards computed."""
        prompts, prefixes, cached, distinct, source = rows
        width = max(len(p) for p in prompts)
        groups = length_groups([len(prompts[row]) - cached[row] for row in distinct])
        out_rows: list[list[int]] = [[] for _ in distinct]  # the rows of each distinct prompt
        for row, i in enumerate(source):
            out_rows[i].append(row)
        logits: torch.Tensor | None = None
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        computed = 0
        for group in groups:
            computed_rows = [distinct[i] for i in group]
            cache, _, group_width, group_logits, group_computed = self.padded(
                [prompts[r] for r in computed_rows], [prefixes[r] for r in computed_rows]
            )
            computed += group_computed
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
                for layer in cache.slots:
                    keys.append(
                        layer.keys.new_zeros(len(prompts), layer.keys.shape[1], width, layer.keys.shape[3])
                    )
                    values.append(
                        layer.values.new_zeros(
                            len(prompts), layer.values.shape[1], width, layer.values.shape[3]
                        )
                    )
            logits[out] = group_logits.index_select(0, src)
            for layer, k, v in zip(cache.slots, keys, values, strict=True):
                k[out, :, width - group_width :] = layer.keys.index_select(0, src)
                v[out, :, width - group_width :] = layer.values.index_select(0, src)
        if logits is None:
            raise BatchShapeError("prefill got no prompts")
        return keys, values, logits, computed

    def padded(
        self, prompts: list[list[int]], prefixes: list[list[LayerKV] | None]
    ) -> tuple[SlotCache, torch.Tensor, int, torch.Tensor, int]:
        """One left-padded forward over `prompts`: (their cache, pads, width, next-token logits,
        positions computed).

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
        new_cache = SlotCache(self.num_layers)
        if start > 0:
            _load_prefixes(new_cache, prefixes, [n - fed for n in lengths], start)
        q = torch.arange(start, width, device=self.device)[:, None]
        kv = torch.arange(width, device=self.device)[None, :]
        valid_kv = kv[None] >= pads[:, None, None]  # [k, 1, width]
        allowed = ((kv <= q)[None] & valid_kv) | (kv == q)[None]  # [k, fed, width]
        mask = self.mask(allowed[:, None], (q - kv)[None, None], additive=False)
        positions = (q.T - pads[:, None]).clamp(min=0)
        logits = self.forward(ids, mask, positions, new_cache)
        return new_cache, pads, width, logits, len(prompts) * fed


def _load_prefixes(
    cache: SlotCache, prefixes: list[list[LayerKV] | None], used: list[int], start: int
) -> None:
    """Fill `cache` with row i's first `used[i]` cached columns, right-aligned in `start` columns."""
    for index, layer in enumerate(cache.slots):
        like = next(kv for kv in prefixes if kv is not None)[index][0]
        keys = like.new_zeros(len(prefixes), like.shape[0], start, like.shape[2])
        values = torch.zeros_like(keys)
        for row, (kv, n) in enumerate(zip(prefixes, used, strict=True)):
            if kv is not None and n > 0:
                keys[row, :, start - n :] = kv[index][0][:, :n]
                values[row, :, start - n :] = kv[index][1][:, :n]
        layer.device = keys.device
        layer.load(keys, values)


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

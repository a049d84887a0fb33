"""`PaddedKVBatch`: the running batch of sequences and their shared, left-padded KV cache.

Layout: every row's tokens are right-aligned in a cache of `length` columns; row i has `pads[i]`
padding columns on the left. Attention masks are built here as explicit 4-D boolean masks
(True = may attend) and positions as explicit per-row `position_ids`, so a row computes exactly
what it would compute alone, unpadded: padding keys are always masked out, and padding *queries*
(during a left-padded prefill) attend only to themselves so that they stay finite (a fully
masked query row would turn into NaN keys/values in the next layer, and 0 * NaN poisons the
real rows).

Rows join with `prefill` (their cache is left-padded to the common length and concatenated on
the batch axis) and leave with `keep_rows` (batch rows dropped, then padding columns no row needs
any more are trimmed). The KV tensors are transformers' own `DynamicCache` layers, whose
`.keys`/`.values` ([batch, kv_heads, seq, head_dim]) are rewritten in place on join/leave.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` in most model forwards.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class PaddedKVBatch:
    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._cache_kwarg = _cache_kwarg(model)
        self.cache: DynamicCache | None = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0  # cache columns

    @property
    def size(self) -> int:
        return int(self.pads.shape[0])

    def clear(self) -> None:
        self.cache = None
        self.pads = torch.zeros(0, dtype=torch.long, device=self.device)
        self.length = 0

    def _forward(self, input_ids, mask, position_ids, cache) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Add `prompts` as new rows at the end of the batch; return their next-token logits [k, V]."""
        width = max(len(p) for p in prompts)
        pads = torch.tensor([width - len(p) for p in prompts], dtype=torch.long, device=self.device)
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        cols = torch.arange(width, device=self.device)
        q, kv = cols[:, None], cols[None, :]
        valid_kv = kv[None] >= pads[:, None, None]  # [k, 1, width]
        mask = ((kv <= q)[None] & valid_kv) | (kv == q)[None]  # [k, width, width]
        positions = (cols[None, :] - pads[:, None]).clamp(min=0)
        new_cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask[:, None], positions, new_cache)
        self._merge(new_cache, pads, width)
        return logits

    def decode(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's last sampled token [B]; return next-token logits [B, V]."""
        if self.cache is None or last_tokens.shape[0] != self.size:
            raise RuntimeError(f"decode got {last_tokens.shape[0]} tokens for a batch of {self.size} rows")
        cols = torch.arange(self.length + 1, device=self.device)
        mask = (cols[None, :] >= self.pads[:, None])[:, None, None, :]  # [B, 1, 1, length+1]
        positions = (self.length - self.pads)[:, None]
        logits = self._forward(last_tokens[:, None], mask, positions, self.cache)
        self.length += 1
        return logits

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
            layer.keys = layer.keys.index_select(0, index)[:, :, trim:]
            layer.values = layer.values.index_select(0, index)[:, :, trim:]
        self.pads = pads - trim
        self.length -= trim

    def _merge(self, new_cache: DynamicCache, new_pads: torch.Tensor, new_length: int) -> None:
        if self.cache is None:
            self.cache, self.pads, self.length = new_cache, new_pads, new_length
            return
        length = max(self.length, new_length)
        grow_old, grow_new = length - self.length, length - new_length
        for old, new in zip(self.cache.layers, new_cache.layers, strict=True):
            old.keys = torch.cat([F.pad(old.keys, (0, 0, grow_old, 0)), F.pad(new.keys, (0, 0, grow_new, 0))])
            old.values = torch.cat(
                [F.pad(old.values, (0, 0, grow_old, 0)), F.pad(new.values, (0, 0, grow_new, 0))]
            )
        self.pads = torch.cat([self.pads + grow_old, new_pads + grow_new])
        self.length = length

"""Stacking per-interaction tensor dicts into right-padded batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from areal_nb.errors import TrainBatchError

if TYPE_CHECKING:
    from areal_nb.api import SamplingSpan

    from .interaction import TokenRow

# What right padding holds: no attention, no turn, no policy version; everything else gets the
# caller's pad value (0 by default).
_PAD_FILL: dict[str, bool | int] = {"attention_mask": False, "turn_ids": -1, "versions": -1}


def stack_token_rows(
    rows: Sequence[TokenRow], rewards: Sequence[float], turn_returns: Sequence[list[float]]
) -> dict[str, torch.Tensor]:
    """Training tensors of `rows`, right-padded to the longest, one tensor per field: what
    `concat_padded_tensors` of the rows' `to_tensor_dict()`s gives, without building nine small
    tensors per row first (a whole batch's are built this way in every training step)."""
    width = max(len(r) for r in rows)

    def padded(key: str, values: list[list], dtype: torch.dtype) -> torch.Tensor:
        fill = _PAD_FILL.get(key, 0)
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype)

    return {
        "input_ids": padded("input_ids", [r.input_ids for r in rows], torch.int64),
        "loss_mask": padded("loss_mask", [r.loss_mask for r in rows], torch.int64),
        "logprobs": padded("logprobs", [r.logprobs for r in rows], torch.float32),
        "versions": padded("versions", [r.versions for r in rows], torch.int64),
        "turn_ids": padded("turn_ids", [r.turn_ids for r in rows], torch.int64),
        "attention_mask": padded("attention_mask", [[True] * len(r) for r in rows], torch.bool),
        "rewards": torch.tensor(list(rewards), dtype=torch.float32),
        "turn_returns": padded("turn_returns", list(turn_returns), torch.float32),
    }


def add_sampling_records(
    tensors: dict[str, Any], rows: Sequence[TokenRow], spans: Sequence[list[SamplingSpan]]
) -> dict[str, Any]:
    """Add what `actor.replay_sampling_masks` reads, when some row was sampled under a mask:
    `sampling_logprobs [B, L]` (the engine's log-prob under the distribution it sampled from at
    masked tokens, `logprobs` elsewhere), `sampling_masked` bool `[B, L]` and `sampling_spans`
    (per row, its `SamplingSpan`s: enough to rebuild each masked token's allowed set). A batch
    without masked tokens is left as it is."""
    if not any(spans):
        return tensors
    sampled = tensors["logprobs"].clone()
    masked = torch.zeros_like(sampled, dtype=torch.bool)
    for b, (row, row_spans) in enumerate(zip(rows, spans, strict=True)):
        for span in row_spans:
            for i, pos in span.positions(len(row)):
                if row.input_ids[pos] == span.tokens[i] and row.loss_mask[pos]:
                    sampled[b, pos] = span.masks.logprobs[i]
                    masked[b, pos] = True
    tensors.update(sampling_logprobs=sampled, sampling_masked=masked, sampling_spans=[list(s) for s in spans])
    return tensors


def concat_padded_tensors(
    dicts: list[dict[str, torch.Tensor]], pad_value: float = 0
) -> dict[str, torch.Tensor]:
    """Right-pad `[1, L]` rows into `[B, Lmax]`; 1-D entries (e.g. `rewards`) become `[B]`.

    `attention_mask` is padded with False, `turn_ids` and `versions` with -1 (no turn, no
    policy version), everything else (`turn_returns` included) with `pad_value`.
    """
    if not dicts:
        return {}
    keys = list(dicts[0])
    for i, d in enumerate(dicts):
        if list(d) != keys and set(d) != set(keys):
            raise TrainBatchError(f"tensor dict {i} has keys {sorted(d)}, expected {sorted(keys)}")
    max_len = max(
        d["attention_mask"].shape[1] if "attention_mask" in d else d[keys[0]].shape[-1] for d in dicts
    )
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [d[key] for d in dicts]
        if tensors[0].dim() == 1:
            out[key] = torch.cat(tensors, dim=0)
            continue
        if any(t.dim() != 2 or t.shape[0] != 1 for t in tensors):
            raise TrainBatchError(
                f"{key!r}: expected [1, L] tensors, got shapes {[tuple(t.shape) for t in tensors]}"
            )
        fill = _PAD_FILL.get(key, pad_value)
        padded = torch.full((len(tensors), max_len), fill, dtype=tensors[0].dtype)
        for i, t in enumerate(tensors):
            padded[i, : t.shape[1]] = t[0]
        out[key] = padded
    return out

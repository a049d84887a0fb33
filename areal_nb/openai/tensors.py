"""Stacking per-interaction tensor dicts into right-padded batches."""

from __future__ import annotations

import torch


def concat_padded_tensors(dicts: list[dict[str, torch.Tensor]], pad_value: float = 0) -> dict[str, torch.Tensor]:
    """Right-pad `[1, L]` rows into `[B, Lmax]`; 1-D entries (e.g. `rewards`) become `[B]`.

    `attention_mask` is padded with False, `turn_ids` and `versions` with -1 (no turn, no
    policy version), everything else (`turn_returns` included) with `pad_value`.
    """
    if not dicts:
        return {}
    keys = list(dicts[0])
    for i, d in enumerate(dicts):
        if list(d) != keys and set(d) != set(keys):
            raise ValueError(f"tensor dict {i} has keys {sorted(d)}, expected {sorted(keys)}")
    max_len = max(d["attention_mask"].shape[1] if "attention_mask" in d else d[keys[0]].shape[-1] for d in dicts)
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [d[key] for d in dicts]
        if tensors[0].dim() == 1:
            out[key] = torch.cat(tensors, dim=0)
            continue
        if any(t.dim() != 2 or t.shape[0] != 1 for t in tensors):
            raise ValueError(f"{key!r}: expected [1, L] tensors, got shapes {[tuple(t.shape) for t in tensors]}")
        fill = False if key == "attention_mask" else (-1 if key in ("turn_ids", "versions") else pad_value)
        padded = torch.full((len(tensors), max_len), fill, dtype=tensors[0].dtype)
        for i, t in enumerate(tensors):
            padded[i, : t.shape[1]] = t[0]
        out[key] = padded
    return out

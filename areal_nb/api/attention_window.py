"""Which of a model's layers attend within a sliding window, and the prepared mask its forward takes.

A transformers model given a ready 4-D attention mask uses it as it is, so a sliding window (every
layer of Mistral; the `sliding_attention` layers of Gemma 3, and of Qwen 2/3 when enabled) has to be
in that mask. The engine (its padded KV batch) and the trainer (its packed tries) build their own
masks, so both ask here which window applies and in which form the model takes the result."""

from __future__ import annotations

from typing import Any


def sliding_window(config: Any) -> int | None:
    """The window (in tokens: a query sees keys less than this many positions back) of `config`'s
    sliding layers, or None when every layer attends in full."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if not window or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def mask_by_layer_type(config: Any, full: Any, windowed: Any) -> Any:
    """What the forward of a model with a sliding window takes as its prepared mask: `windowed`
    alone when every layer slides (no `layer_types`), else one mask per layer type."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return windowed
    return {kind: windowed if kind == "sliding_attention" else full for kind in set(layer_types)}

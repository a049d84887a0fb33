"""`LoraAdapter`: a LoRA adapter in the form peft saves it, handed from the trainer to an engine.

An engine that serves base + adapter (`SGLangEngine` over servers started with `--enable-lora`)
takes one in `update_weights` and writes it as a peft folder (`adapter_config.json`,
`adapter_model.safetensors`) for its servers to load; it declares so with
`serves_lora_adapters = True` (`InferenceEngine`'s capability). The others get merged weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraAdapter:
    # the adapter's tensors under the names peft's `save_pretrained` writes
    # (`base_model.model.<module>.lora_A.weight`, `...lora_B.weight`)
    tensors: dict[str, Any]
    # peft's adapter_config.json as a JSON-ready dict (r, lora_alpha, target_modules, ...)
    config: dict[str, Any]

    @property
    def rank(self) -> int:
        return int(self.config["r"])

"""LoRA adapters on the policy (`actor.lora`), with `peft`.

`wrap_lora(model, cfg)` freezes the base weights and adds trainable low-rank adapters
(ΔW = B·A·alpha/r, B starting at zero: the wrapped model starts as the base). The actor's
optimizer then holds only the adapter's parameters and their AdamW state.

peft injects its LoRA layers into the base model in place: the base model (`lora_base`)
computes base + adapter itself, so the trainer's forwards (and their fast paths that walk
`model.model.layers`: packing, tree attention, the last layer at the heads) run on the
unwrapped base model unchanged. `disable_adapter()` on the wrapper turns the adapters off in
those same layers: the KL reference is the base model that way, with no second copy.

The embedded engine gets merged weights (`merged_weights`: base + ΔW under the base model's
names) at each push: its forward stays the plain model's, and the pushed tensors are exactly
those the trainer's base + adapter computes with. An engine that serves adapters itself
(`serves_lora_adapters`: SGLang servers, `areal-nb engine-server`) gets the adapter alone
(`lora_adapter`: peft's saved tensors and adapter_config.json), a few MB instead of the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from areal_nb.api import LoraAdapter

__all__ = ["LoraConfig", "is_lora_model", "lora_adapter", "lora_base", "merged_weights", "wrap_lora"]


@dataclass
class LoraConfig:
    """`actor.lora`: low-rank adapters trained on the frozen base model."""

    r: int = 8
    """The adapters' rank."""
    alpha: float = 16.0
    """ΔW is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input. The actor runs the model in eval mode (dropout would make
    π_θ differ from the policy that sampled), so it is off in training as well."""
    target_modules: list[str] | str = field(default="all-linear")
    """peft's names: module-name suffixes (["q_proj", "v_proj"]) or "all-linear" (every linear
    layer but the LM head). The LM head cannot be adapted: the log-prob pass reads its weight."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        targets = [self.target_modules] if isinstance(self.target_modules, str) else list(self.target_modules)
        if not targets:
            raise ValueError(
                "lora.target_modules is empty: name module suffixes (e.g. [q_proj, v_proj]) or all-linear"
            )
        if "lm_head" in targets:
            raise ValueError(
                "lora.target_modules cannot hold lm_head: the log-prob pass reads the LM head's weight"
            )


def wrap_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """`model` with trainable LoRA adapters (a `peft.PeftModel`); only the adapters require grad."""
    try:
        import peft
    except ImportError as exc:
        raise ImportError("actor.lora needs peft: pip install 'areal_nb[lora]'") from exc
    config = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def is_lora_model(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def lora_base(model: torch.nn.Module) -> torch.nn.Module:
    """The model the forwards run: a PeftModel's base (adapters injected), else `model` itself."""
    return model.get_base_model() if is_lora_model(model) else model


@torch.no_grad()
def merged_weights(model: torch.nn.Module, adapters: bool = True) -> dict[str, Tensor]:
    """The base model's state dict with each active adapter's ΔW added to its layer's weight,
    under the plain model's names (no adapter tensors; `model` itself is unchanged).
    `adapters=False`: the frozen base weights alone, under the same names."""
    from peft.tuners.lora import LoraLayer

    base = lora_base(model)
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules() if adapters else ():
        if isinstance(module, LoraLayer) and not module.disable_adapters:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = module.get_delta_weight(adapter)
                    deltas[name] = deltas[name] + delta if name in deltas else delta
    out: dict[str, Any] = {}
    for key, value in base.state_dict().items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        if "base_layer" in parts:
            owner = ".".join(parts[: parts.index("base_layer")])
            if parts[-1] == "weight" and owner in deltas:
                value = value + deltas[owner].to(value.dtype)
            key = ".".join(p for p in parts if p != "base_layer")
        out[key] = value
    return out


@torch.no_grad()
def lora_adapter(model: torch.nn.Module) -> LoraAdapter:
    """The active adapter as peft's `save_pretrained` writes it: its tensors (detached copies, in
    the dtype they train in) under peft's saved names, and adapter_config.json's content."""
    from peft import get_peft_model_state_dict

    name = model.active_adapter
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}
    config = model.peft_config[name].to_dict()
    config["inference_mode"] = True  # (as save_pretrained writes it)
    return LoraAdapter(tensors=tensors, config={k: _json_ready(v) for k, v in config.items()})


def _json_ready(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value

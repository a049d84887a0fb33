"""Trained policies out as Hugging Face folders that plain `transformers` (or `peft`) loads.

A folder holds `model.safetensors` (the weights, in the run's configured `model.dtype`: the
float32 master weights cast once, as the engine serves them), `config.json` (its dtype set to
that dtype), `generation_config.json`, and the tokenizer files with its chat template, so
`AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` give the
policy the engine sampled from.

With a LoRA actor (`actor.lora`), `merged=True` folds the adapter into the base weights (a plain
model folder as above); `merged=False` writes only the adapter (`adapter_config.json` +
`adapter_model.safetensors`), which `peft.PeftModel.from_pretrained(base, dir)` loads on the base.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_nb.config import load_config
from areal_nb.train.lora import is_lora_model, merged_weights, wrap_lora
from areal_nb.train.precision import serving_weights

from .checkpoint import read_checkpoint

if TYPE_CHECKING:
    from .session import Session

__all__ = ["export_checkpoint", "save_pretrained", "write_model_folder"]


def save_pretrained(
    session: Session, path: str | Path, *, merged: bool = True, weights: dict[str, Any] | None = None
) -> Path:
    """Write the session's current policy to `path` (see the module doc); returns the path.
    `weights`: the actor's full weights when the caller gathered them (FSDP: every rank does)."""
    actor = session.actor
    dtype = getattr(torch, session.config.model.dtype)
    if not merged and not is_lora_model(actor.model):
        raise ValueError(
            "save_pretrained(merged=False) writes a LoRA adapter; this run trains full weights "
            "(no actor.lora): use merged=True"
        )
    if not merged:
        return write_adapter_folder(actor.model, session.tokenizer, path)
    return write_model_folder(
        actor.model, actor.weights() if weights is None else weights, session.tokenizer, dtype, path
    )


def write_model_folder(
    model: torch.nn.Module, weights: dict[str, Any], tokenizer: Any, dtype: torch.dtype, path: str | Path
) -> Path:
    """`weights` (the model's full state dict, float32 master weights) as a transformers folder
    in `dtype`. A LoRA model's weights are merged first (base names, no adapter tensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if is_lora_model(model):
        weights = merged_weights(model)
        model = model.get_base_model()
    # (a dict of its own: save_pretrained drops tied weights' duplicate keys from the dict it gets)
    model.save_pretrained(path, state_dict=dict(serving_weights(weights, dtype)), safe_serialization=True)
    config = copy.deepcopy(model.config)
    config.dtype = dtype  # what from_pretrained(dtype="auto") loads in, and what the weights are
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)  # (with its chat template)
    return path


def write_adapter_folder(model: torch.nn.Module, tokenizer: Any, path: str | Path) -> Path:
    """The adapter alone, for `peft.PeftModel.from_pretrained(base_model, path)`."""
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """A `Session.save` checkpoint's policy as a transformers folder (no Session, no engine)."""
    from areal_nb.models import load_model, load_tokenizer

    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.yaml").exists() or not (checkpoint / "model").is_dir():
        raise FileNotFoundError(f"{checkpoint} is not a Session checkpoint (no config.yaml and model/)")
    cfg = load_config(checkpoint / "config.yaml")
    model = load_model(str(checkpoint / "model"), dtype=torch.float32)
    if cfg.actor.lora is not None:  # model/ is the base; the trained adapters are in state.pt
        model = wrap_lora(model, cfg.actor.lora)
        model.load_state_dict(read_checkpoint(checkpoint)["actor"]["model"])
    tokenizer = load_tokenizer(str(checkpoint / "model"))
    return write_model_folder(model, model.state_dict(), tokenizer, getattr(torch, cfg.model.dtype), out)

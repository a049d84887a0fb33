"""Trained policies out as Hugging Face folders that plain `transformers` (or `peft`) loads.

A folder holds `model.safetensors` (the weights, in the run's configured `model.dtype`: the
float32 master weights cast once, as the engine serves them), `config.json` (its dtype set to
that dtype), `generation_config.json`, and the tokenizer files with its chat template, so
`AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` give the
policy the engine sampled from.

With a LoRA actor (`actor.lora`), `merged=True` folds the adapter into the base weights (a plain
model folder as above); `merged=False` writes only the adapter (`adapter_config.json` +
`adapter_model.safetensors`), which `peft.PeftModel.from_pretrained(base, dir)` loads on the base.

With one adapter per agent (the `agents` config) each agent is its own policy: `agent=` names
the one to write, merged into the base or as its adapter alone (at the folder's top, as peft saves
a single adapter).

`export_checkpoint` does the same from a checkpoint, or from a run folder's latest checkpoint.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from areal_nb.config import load_config
from areal_nb.engine.weight_sync import write_adapter_files
from areal_nb.errors import ExportError
from areal_nb.train.lora import (
    is_lora_model,
    load_adapter_state,
    lora_adapter,
    lora_base,
    merged_weights,
    use_adapter,
    wrap_agent_lora,
    wrap_lora,
)
from areal_nb.train.precision import serving_weights

from .base_model import base_reference, check_same_base
from .checkpoint import MANIFEST, read_checkpoint

# how deep under a run folder `find_checkpoint` looks (runs/<name>/checkpoints/step<N>/manifest.json)
CHECKPOINT_DEPTH = 4

if TYPE_CHECKING:
    from .session import Session

__all__ = ["export_checkpoint", "find_checkpoint", "save_pretrained", "write_model_folder"]


def save_pretrained(
    session: Session,
    path: str | Path,
    *,
    merged: bool = True,
    weights: dict[str, Any] | None = None,
    agent: str | None = None,
) -> Path:
    """Write the session's current policy to `path` (see the module doc); returns the path.
    `weights`: what the caller gathered (FSDP: every rank does): the policy's full weights
    (`Actor.policy_weights`, LoRA merged), or with `merged=False` the adapter's. `agent`: with
    one adapter per agent, whose policy (required then, refused otherwise)."""
    actor = session.actor
    dtype = getattr(torch, session.config.model.dtype)
    agent = check_agent(list(session.config.agents), agent)
    if agent is not None:
        return write_agent_policy(actor.model, agent, session.tokenizer, dtype, path, merged=merged)
    if not merged and not is_lora_model(actor.model):
        raise ExportError(
            "save_pretrained(merged=False) writes a LoRA adapter; this run trains full weights "
            "(no actor.lora): use merged=True"
        )
    if not merged:
        return write_adapter_folder(actor.model, session.tokenizer, path, adapters=weights)
    weights = actor.policy_weights() if weights is None else weights
    return write_model_folder(lora_base(actor.model), weights, session.tokenizer, dtype, path)


def write_model_folder(
    model: torch.nn.Module, weights: dict[str, Any], tokenizer: Any, dtype: torch.dtype, path: str | Path
) -> Path:
    """`weights` (the model's full state dict, float32 master weights) as a transformers folder
    in `dtype`. A LoRA model's weights are merged first (base names, no adapter tensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf: Any = model  # (a transformers or peft model: its methods are not nn.Module's)
    if is_lora_model(model):
        weights = merged_weights(model)
        hf = hf.get_base_model()
    # (a dict of its own: save_pretrained drops tied weights' duplicate keys from the dict it gets)
    hf.save_pretrained(path, state_dict=dict(serving_weights(weights, dtype)), safe_serialization=True)
    config = copy.deepcopy(hf.config)
    config.dtype = dtype  # what from_pretrained(dtype="auto") loads in, and what the weights are
    config.save_pretrained(path)
    if getattr(hf, "generation_config", None) is not None:
        hf.generation_config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)  # (with its chat template)
    return path


def check_agent(agents: list[str], agent: str | None) -> str | None:
    """`agent`, checked against the run's agents with an adapter of their own (ValueError)."""
    if agents and agent not in agents:
        raise ExportError(
            f"this run trains one adapter per agent: name the agent to export ({', '.join(agents)})"
            + ("" if agent is None else f"; {agent!r} is not one of them")
        )
    if not agents and agent is not None:
        raise ExportError(
            f"agent={agent!r} names an agent's own adapter, but this run trains one policy for every "
            "agent (no `agents` config): export without agent"
        )
    return agent


def write_agent_policy(
    model: torch.nn.Module, agent: str, tokenizer: Any, dtype: torch.dtype, path: str | Path, *, merged: bool
) -> Path:
    """One agent's policy of a model with one adapter per agent: the base with its adapter merged
    (a plain transformers folder), or its adapter alone (peft's files at the folder's top)."""
    use_adapter(model, agent)
    if merged:
        return write_model_folder(lora_base(model), merged_weights(model), tokenizer, dtype, path)
    adapter = lora_adapter(model)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_adapter_files(path, adapter)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def write_adapter_folder(
    model: torch.nn.Module, tokenizer: Any, path: str | Path, adapters: dict[str, Any] | None = None
) -> Path:
    """The adapter alone, for `peft.PeftModel.from_pretrained(base_model, path)`. `adapters`: its
    full tensors when the caller gathered them (FSDP), else the model's own."""
    path = Path(path)
    cast(Any, model).save_pretrained(path, safe_serialization=True, state_dict=adapters)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def find_checkpoint(path: str | Path) -> Path:
    """`path` itself when it is a checkpoint, else the latest checkpoint written under it (a run
    folder: `checkpoint.save_dir`'s `step<N>`, an exported run's `checkpoint/` and its job's
    results): the one whose manifest, written last, is newest. Folders being written (hidden
    `.NAME.saving-*` siblings) are not looked into."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path} is not a Session checkpoint or a run folder: {'not a folder' if path.exists() else 'no such folder'}"
        )
    if (path / MANIFEST).is_file() or (path / "state.pt").is_file():
        return path
    found = [
        manifest.parent
        for depth in range(1, CHECKPOINT_DEPTH + 1)
        for manifest in path.glob("/".join(["*"] * depth) + "/" + MANIFEST)
        if not any(part.startswith(".") for part in manifest.relative_to(path).parts)
    ]
    if not found:
        raise FileNotFoundError(
            f"{path} is not a Session checkpoint (no config.yaml and model/) and holds none "
            f"(no manifest.json up to {CHECKPOINT_DEPTH} folders down)"
        )
    return max(found, key=lambda folder: ((folder / MANIFEST).stat().st_mtime_ns, str(folder)))


def export_checkpoint(
    checkpoint: str | Path, out: str | Path, *, merged: bool = True, agent: str | None = None
) -> Path:
    """A `Session.save` checkpoint's policy (or a run folder's latest one, `find_checkpoint`) as a
    transformers folder, or with `merged=False` a LoRA run's adapter for peft (no Session, no
    engine). A LoRA checkpoint's base is loaded from where it names it, and must be the same.
    `agent`: a run with one adapter per agent exports that agent's policy."""
    from areal_nb.models import load_model, load_tokenizer

    checkpoint = find_checkpoint(checkpoint)
    state = read_checkpoint(checkpoint, check_config=False)  # every file checked first
    base = state["base_model"]  # LoRA: the base the adapter was trained on (None: model/ holds it)
    model_path = base["path"] if base is not None else str(checkpoint / "model")
    cfg = load_config(checkpoint / "config.yaml", {"model.path": model_path})
    agent = check_agent(list(cfg.agents), agent)
    if not merged and cfg.actor.lora is None and agent is None:
        raise ExportError(
            f"{checkpoint} is a full-weight run's checkpoint: it has no LoRA adapter to export alone"
        )
    model = load_model(model_path, dtype=torch.float32)
    if base is not None:
        check_same_base(base, base_reference(model_path, model), str(checkpoint))
    if agent is not None:  # every agent's adapter is in state.pt
        model = wrap_agent_lora(model, cfg.agent_lora)
        load_adapter_state(model, state["actor"]["model"])
    elif cfg.actor.lora is not None:  # the trained adapters are in state.pt
        model = wrap_lora(model, cfg.actor.lora)
        load_adapter_state(model, state["actor"]["model"])
    else:
        model.load_state_dict(state["actor"]["model"])
    tokenizer = load_tokenizer(str(checkpoint / "model"))
    if agent is not None:
        return write_agent_policy(
            model, agent, tokenizer, getattr(torch, cfg.model.dtype), out, merged=merged
        )
    if not merged:
        return write_adapter_folder(model, tokenizer, out)
    return write_model_folder(model, model.state_dict(), tokenizer, getattr(torch, cfg.model.dtype), out)

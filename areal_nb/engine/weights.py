"""Loading a model for the engine and checking weight updates before they reach the worker."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from areal_nb.api.saved_tokenizer import load_saved_tokenizer
from areal_nb.errors import ArgumentTypeError, ModelFileError, WeightUpdateError


def can_share_weights(model: Any, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an engine on `device` in `dtype` can serve `model`'s parameters themselves: a loaded
    model whose floating parameters all are `dtype` tensors on `device`."""
    if not isinstance(model, PreTrainedModel):
        return False
    params = [p for p in model.parameters() if p.is_floating_point()]
    same_device = lambda d: d.type == device.type and device.index in (None, d.index)  # noqa: E731
    return bool(params) and all(p.dtype == dtype and same_device(p.device) for p in params)


def load_engine_model(
    model: str | os.PathLike | PreTrainedModel,
    tokenizer: Any,
    device: torch.device,
    dtype: torch.dtype,
    share_weights: bool = False,
) -> tuple[PreTrainedModel, Any]:
    """The engine's model (sdpa attention, or eager for soft-capped scores; eval mode) and its tokenizer.

    `model` is a loaded model, a local `save_pretrained` folder or a Hugging Face id. Built-in
    names such as `tiny-math` belong to `areal_nb.models` (a layer above the engine): resolve
    them first with `areal_nb.models.resolve_model_path` (the Session and the CLI do). Without a
    `tokenizer`, the folder's own is loaded as saved (`areal_nb.api.load_saved_tokenizer`).
    `share_weights` (where `can_share_weights`): the modules are the engine's own (its attention
    setting, eval mode, buffers), the parameters are the caller's tensors, not copies.
    """
    if isinstance(model, PreTrainedModel):
        # A deep copy: the trainer keeps updating its model; the engine changes only on update_weights.
        # Shared: the copy's memo maps every parameter to itself, so only the modules are new.
        shared = {id(p): p for p in model.parameters()} if share_weights else {}
        engine_model = copy.deepcopy(model, shared)
        if tokenizer is None:
            source = getattr(model.config, "_name_or_path", "")
            if source and Path(source).is_dir():
                tokenizer = load_saved_tokenizer(source)
    elif isinstance(model, (str, os.PathLike)):
        path = str(model)
        try:
            engine_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except OSError as exc:
            if Path(path).expanduser().exists():
                raise
            raise ModelFileError(
                f"cannot load model {path!r}: not a local folder and not loadable as a Hugging Face id "
                f"({exc}). Built-in names like 'tiny-math' are resolved by "
                "areal_nb.models.resolve_model_path(name), which returns the folder to pass here"
            ) from exc
        if tokenizer is None:
            tokenizer = load_saved_tokenizer(path)
    else:
        raise ArgumentTypeError(
            f"model must be a name, a path or a PreTrainedModel, got {type(model).__name__}"
        )
    # The engine builds explicit 4-D masks, which the sdpa path takes as they are; sdpa has no
    # soft-capping of attention scores (Gemma 2, some Gemma 3 configs), the eager path has.
    soft_capped = getattr(engine_model.config, "attn_logit_softcapping", None)
    engine_model.set_attn_implementation("eager" if soft_capped else "sdpa")
    # transformers wraps PreTrainedModel.to in functools.wraps, whose stubs lose the bound self
    engine_model = engine_model.to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
    if (
        not share_weights
    ):  # (shared parameters keep the trainer's requires_grad; the engine runs under inference_mode)
        engine_model.requires_grad_(False)
    return engine_model, tokenizer


def read_weights_dir(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict stored in a `save_pretrained` directory (safetensors or pytorch .bin).

    A file that cannot be read as weights (empty, truncated, random bytes, a pickle that is not
    plain tensors) is a ValueError naming it; .bin files are read with `weights_only=True`, so a
    pickle never runs code."""
    folder = Path(path)
    if not folder.is_dir():
        raise WeightUpdateError(
            f"update_weights: {str(path)!r} is not a directory saved with save_pretrained"
        )
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        return _read_each(files, lambda f: load_file(str(f)))
    files = sorted(folder.glob("pytorch_model*.bin"))
    if files:
        return _read_each(files, lambda f: torch.load(f, map_location="cpu", weights_only=True))
    raise WeightUpdateError(f"update_weights: no *.safetensors or pytorch_model*.bin files in {str(path)!r}")


def _read_each(files: list[Path], read: Any) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = read(f)
        except Exception as exc:  # noqa: BLE001 - any failure to parse a user's file is the file's fault
            text = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise WeightUpdateError(
                f"update_weights: cannot read {str(f)!r} as weights: {type(exc).__name__}: {text}"
            ) from None
        if not isinstance(part, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in part.items()
        ):
            raise WeightUpdateError(
                f"update_weights: {str(f)!r} does not hold a mapping of parameter names to tensors"
            )
        state.update(part)
    return state


def check_weights(model: PreTrainedModel, weights: dict[str, torch.Tensor]) -> None:
    """Raise ValueError naming every unknown key or shape mismatch (nothing is applied then)."""
    if not isinstance(weights, dict) or not weights:
        raise WeightUpdateError("update_weights needs a non-empty state dict or a save_pretrained directory")
    not_tensors = sorted(str(k) for k, v in weights.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise WeightUpdateError(
            f"update_weights: {len(not_tensors)} value(s) are not tensors, e.g. {not_tensors[:5]}"
        )
    own = model.state_dict()
    unknown = sorted(k for k in weights if k not in own)
    if unknown:
        raise WeightUpdateError(
            f"update_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:5]}"
        )
    wrong = [
        f"{k}: got {tuple(v.shape)}, model has {tuple(own[k].shape)}"
        for k, v in weights.items()
        if tuple(v.shape) != tuple(own[k].shape)
    ]
    if wrong:
        raise WeightUpdateError(f"update_weights: shape mismatch for {wrong[:5]}")


@torch.no_grad()
def copy_weights_into(model: PreTrainedModel, weights: dict[str, torch.Tensor]) -> None:
    """Copy `weights` into the model's own tensors (the engine never aliases a caller's tensor);
    a tensor that already is the model's own (an engine serving the trainer's parameters) is left."""
    own = model.state_dict()
    for name, value in weights.items():
        if not _same_tensor(own[name], value):
            own[name].copy_(value)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
    )

"""Weights through a shared directory: what the trainer writes and engine servers load from disk.

`write_weights(dir, version, model)` writes `dir/version-<v>/` in one atomic step: the files go to
a hidden temporary directory beside it, which `os.replace` then renames into place, so a server
never sees a half-written checkpoint. A `PreTrainedModel` is written with `save_pretrained`
(safetensors + config); a bare state dict as one `model.safetensors` plus the config files copied
from `config_source` when given. Older versions beyond `keep` are removed. `write_adapter` writes a
LoRA adapter the same way as peft's folder `dir/adapter-<v>/` (a few MB, for `/load_lora_adapter`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from areal_nb.api import agent_token
from areal_nb.errors import ArgumentTypeError

VERSION_PREFIX = "version-"
ADAPTER_PREFIX = "adapter-"
_CONFIG_FILES = ("config.json", "generation_config.json")


def version_dir(weights_dir: str | os.PathLike, version: int) -> Path:
    return Path(weights_dir) / f"{VERSION_PREFIX}{int(version)}"


def write_adapter_files(folder: Path, adapter: Any) -> None:
    """A `LoraAdapter` as peft's two files in `folder`: `adapter_model.safetensors` and
    `adapter_config.json` (what `peft.PeftModel.from_pretrained` and SGLang load)."""
    from safetensors.torch import save_file

    tensors = {k: t.detach().to("cpu").contiguous().clone() for k, t in adapter.tensors.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps(adapter.config, indent=2, sort_keys=True))


def write_adapter(
    weights_dir: str | os.PathLike, version: int, adapter: Any, *, keep: int = 2, agent: str | None = None
) -> Path:
    """Write a LoRA adapter (`areal_nb.api.LoraAdapter`) as peft's folder
    `weights_dir/adapter-<version>` (adapter_config.json, adapter_model.safetensors), in one
    atomic step like `write_weights`; older adapter folders beyond `keep` are removed. `agent`:
    one agent's adapter, `adapter-<agent>-<version>` (its older ones pruned apart from the others')."""
    root = Path(weights_dir)
    prefix = ADAPTER_PREFIX if agent is None else f"{ADAPTER_PREFIX}{agent_token(agent)}-"
    target = _write_atomically(
        root, root / f"{prefix}{int(version)}", lambda folder: write_adapter_files(folder, adapter)
    )
    _prune(root, keep=keep, current=target, prefix=prefix)
    return target


def write_weights(
    weights_dir: str | os.PathLike,
    version: int,
    weights: Any,
    *,
    config_source: str | os.PathLike | None = None,
    keep: int = 2,
) -> Path:
    """Write `weights` (a PreTrainedModel or a state dict) as `weights_dir/version-<version>`."""

    def write(folder: Path) -> None:
        if hasattr(weights, "save_pretrained"):
            weights.save_pretrained(folder, safe_serialization=True)
        elif isinstance(weights, dict):
            _save_state_dict(weights, folder, config_source)
        else:
            raise ArgumentTypeError(
                f"weights must be a PreTrainedModel or a state dict, got {type(weights).__name__}"
            )

    root = Path(weights_dir)
    target = _write_atomically(root, version_dir(root, version), write)
    _prune(root, keep=keep, current=target)
    return target


def _write_atomically(root: Path, target: Path, write: Any) -> Path:
    """`write(folder)` into a hidden folder beside `target`, then renamed to `target`."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{target.name}-"))
    try:
        write(tmp)
        if target.exists():  # rewriting a version: move the old one aside first (rename is atomic)
            old = Path(tempfile.mkdtemp(dir=root, prefix=f".old-{target.name}-"))
            os.replace(target, old / target.name)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _save_state_dict(state: dict, folder: Path, config_source: str | os.PathLike | None) -> None:
    from safetensors.torch import save_file

    # clone: tied parameters share storage, which safetensors refuses to write twice
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if config_source is not None:
        for name in _CONFIG_FILES:
            source = Path(config_source) / name
            if source.is_file():
                shutil.copy2(source, folder / name)


def _prune(root: Path, keep: int, current: Path, prefix: str = VERSION_PREFIX) -> None:
    versions = []
    for entry in root.iterdir():
        if entry.is_dir() and entry.name.startswith(prefix):
            try:
                versions.append((int(entry.name[len(prefix) :]), entry))
            except ValueError:
                continue
    versions.sort()
    for _, entry in versions[: max(0, len(versions) - keep)]:
        if entry != current:
            shutil.rmtree(entry, ignore_errors=True)

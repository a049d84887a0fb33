"""Weights through a shared directory: what the trainer writes and engine servers load from disk.

`write_weights(dir, version, model)` writes `dir/version-<v>/` in one atomic step: the files go to
a hidden temporary directory beside it, which `os.replace` then renames into place, so a server
never sees a half-written checkpoint. A `PreTrainedModel` is written with `save_pretrained`
(safetensors + config); a bare state dict as one `model.safetensors` plus the config files copied
from `config_source` when given. Older versions beyond `keep` are removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

VERSION_PREFIX = "version-"
_CONFIG_FILES = ("config.json", "generation_config.json")


def version_dir(weights_dir: str | os.PathLike, version: int) -> Path:
    return Path(weights_dir) / f"{VERSION_PREFIX}{int(version)}"


def write_weights(
    weights_dir: str | os.PathLike,
    version: int,
    weights: Any,
    *,
    config_source: str | os.PathLike | None = None,
    keep: int = 2,
) -> Path:
    """Write `weights` (a PreTrainedModel or a state dict) as `weights_dir/version-<version>`."""
    root = Path(weights_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = version_dir(root, version)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{target.name}-"))
    try:
        if hasattr(weights, "save_pretrained"):
            weights.save_pretrained(tmp, safe_serialization=True)
        elif isinstance(weights, dict):
            _save_state_dict(weights, tmp, config_source)
        else:
            raise TypeError(
                f"weights must be a PreTrainedModel or a state dict, got {type(weights).__name__}"
            )
        if target.exists():  # rewriting a version: move the old one aside first (rename is atomic)
            old = Path(tempfile.mkdtemp(dir=root, prefix=f".old-{target.name}-"))
            os.replace(target, old / target.name)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep=keep, current=target)
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


def _prune(root: Path, keep: int, current: Path) -> None:
    versions = []
    for entry in root.iterdir():
        if entry.is_dir() and entry.name.startswith(VERSION_PREFIX):
            try:
                versions.append((int(entry.name[len(VERSION_PREFIX) :]), entry))
            except ValueError:
                continue
    versions.sort()
    for _, entry in versions[: max(0, len(versions) - keep)]:
        if entry != current:
            shutil.rmtree(entry, ignore_errors=True)

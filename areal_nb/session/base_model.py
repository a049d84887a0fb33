"""The base model a LoRA checkpoint's adapter was trained on, and the check that a load gets it.

A LoRA run's checkpoint does not copy the frozen base weights: it names them. `base_model.json`
records `path` (what `model.path` loads: a built-in name or a Hugging Face id as given, a local
folder or GGUF file as an absolute path), `resolved` (where that led when the run started; for the reader) and
`sha256`, a hash of the base's float32 tensors as loaded (names, shapes and bytes), so a load
whose `model.path` now gives other weights (a rebuilt tiny model, another revision of a hub
model, a different folder) is refused with both hashes before anything is built on them.

The hash is taken once per Session from the policy as loaded (before the adapters wrap it and
FSDP shards it): hashing a 1.5B float32 model reads 6 GB, a few seconds at start.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from areal_nb.errors import CheckpointError

BASE_FILE = "base_model.json"

__all__ = ["BASE_FILE", "base_reference", "check_same_base", "read_base_file", "write_base_file"]


def base_reference(model_path: str, policy: torch.nn.Module) -> dict[str, Any]:
    """`policy` (the base as loaded from `model_path`, not yet wrapped) as a checkpoint names it."""
    from areal_nb.models import resolve_model_path

    local = Path(str(model_path)).expanduser()
    return {
        "path": str(local.resolve()) if local.is_dir() or local.is_file() else str(model_path),
        "resolved": str(resolve_model_path(str(model_path))),
        "sha256": weights_sha256(policy),
        "parameters": sum(p.numel() for p in policy.parameters()),
    }


@torch.no_grad()
def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over the model's state dict in name order: each name, shape, dtype and raw bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{list(value.shape)}|{value.dtype}\n".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_base_file(reference: dict[str, Any], folder: Path) -> None:
    (folder / BASE_FILE).write_text(json.dumps(reference, indent=1))


def read_json_file(file: Path) -> Any:
    """A checkpoint's JSON file, or CheckpointError naming it when it cannot be read as JSON."""
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: not readable JSON ({e})") from e


def read_base_file(folder: Path) -> dict[str, Any] | None:
    """The checkpoint's base reference (None: not a LoRA checkpoint); CheckpointError if damaged."""
    file = folder / BASE_FILE
    if not file.exists():
        return None
    reference = read_json_file(file)
    if not isinstance(reference, dict) or not all(
        isinstance(reference.get(k), str) and reference[k] for k in ("path", "sha256")
    ):
        raise CheckpointError(f"{file}: not a base model reference (needs a path and a sha256)")
    return reference


def check_same_base(saved: dict[str, Any] | None, current: dict[str, Any] | None, where: str) -> None:
    """Refuse to put a checkpoint's adapter on another base than it was trained on, or on a run
    without actor.lora. `where`: the checkpoint, as the message names it."""
    if saved is None:  # full weights (or a LoRA checkpoint that kept its base in model/)
        return
    if current is None:
        raise CheckpointError(
            f"{where}: holds a LoRA adapter trained on {saved['path']!r}, but the config has no "
            f"actor.lora: load it with the checkpoint's own config (or set actor.lora as saved)"
        )
    if saved["sha256"] != current["sha256"]:
        raise CheckpointError(
            f"{where}: the adapter was trained on the base model {saved['path']!r} (weights sha256 "
            f"{saved['sha256'][:12]}…, from {saved.get('resolved', '?')}), but model.path "
            f"{current['path']!r} now loads other weights (sha256 {current['sha256'][:12]}…, from "
            f"{current['resolved']}): set model.path to the base it was trained on"
        )

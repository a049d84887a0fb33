"""A checkpoint folder's files: what every checkpoint holds, its manifest (each file's size and
SHA-256, written last) and the durable write (every file fsynced, the folder renamed into place).

`checkpoint.py` writes checkpoints with these, `checkpoint_verify.py` checks them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from areal_nb.errors import CheckpointError

from .base_model import read_json_file

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "areal_nb checkpoint"
# What every checkpoint holds (besides model/'s weights and tokenizer files, checked by kind)
REQUIRED = ("config.yaml", "state.pt", "history.json", "model/config.json")
STATE_KEYS = ("step_count", "version", "actor", "rng", "data_pos")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")


def write_manifest(folder: Path) -> None:
    files = {
        rel: {"size": (folder / rel).stat().st_size, "sha256": sha256_of(folder / rel)}
        for rel in files_under(folder)
        if rel != MANIFEST
    }
    (folder / MANIFEST).write_text(
        json.dumps({"format": MANIFEST_FORMAT, "version": 1, "files": files}, indent=1)
    )


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, None when it has none; `CheckpointError` for a damaged one."""
    file = folder / MANIFEST
    if not file.exists():
        return None
    manifest = read_json_file(file)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{file}: not an areal_nb checkpoint manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise CheckpointError(f"{file}: its file list is damaged (each entry needs a size and a sha256)")
    return manifest


def sync_tree(folder: Path) -> None:
    """Every file and folder of the new checkpoint on disk before it takes the target's name."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_dir(Path(root))


def sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot sync a directory; the files are synced
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def replace_folder(final: Path, new: Path) -> None:
    """`new` takes `final`'s name; an earlier `final` is renamed aside first, put back if that
    fails, and deleted once the new one is in place."""
    if not final.exists():
        os.replace(new, final)
        sync_dir(final.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    os.replace(final, old)  # (onto the empty folder mkdtemp made)
    try:
        os.replace(new, final)
    except BaseException:
        os.replace(old, final)
        raise
    sync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())

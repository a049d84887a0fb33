"""GGUF files as models: converted once into a plain Hugging Face folder, cached by the file's hash.

A `.gguf` file (llama.cpp's format, often quantized) is read by transformers
(`from_pretrained(folder, gguf_file=name)`, with the `gguf` package), which dequantizes it into an
ordinary float model and builds its tokenizer and chat template from the file's metadata. Doing
that on every load would take tens of seconds and leave a `quantization_config` in the model's
config that `save_pretrained` writes out, so the file is converted once: a float32 model (the
trainer's master weights; `model.dtype` is what it computes in) and its tokenizer, saved with
`save_pretrained` as `<cache>/gguf/<stem>-<hash>/` without the quantization marker. That folder is
what `resolve_model_path` returns, so the trainer, the engine, engine servers, checkpoints and
`areal-nb export-model` all see a plain folder that `AutoModelForCausalLM.from_pretrained` loads.

The hash covers the file's bytes, the transformers version that dequantized it and this module,
so an edited file or another transformers converts again. Hashing reads the file once per process
(remembered by path, size and modification time).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from areal_nb.errors import MissingPackageError, ModelFileError

from .cache import cache_root, cached_build, recipe_hash

_GGUF_MAGIC = b"GGUF"
_GGUF_SUFFIX = ".gguf"
_BUILD_INFO = "build_info.json"
_hashes: dict[tuple[str, int, int], str] = {}


def is_gguf_path(name_or_path: str) -> bool:
    """Whether `model.path` names a GGUF file (by its suffix: a hub id never ends in .gguf)."""
    return str(name_or_path).lower().endswith(_GGUF_SUFFIX)


def gguf_model_dir(path: str | Path) -> Path:
    """The cached Hugging Face folder converted from the GGUF file `path` (converted on first use)."""
    file = _checked_file(Path(path).expanduser())
    key = recipe_hash(
        {"sha256": _file_sha256(file), "transformers": _transformers_version()}, [Path(__file__)]
    )
    final = cache_root() / "gguf" / f"{file.stem}-{key}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    return cached_build(final, lambda tmp: _convert_gguf(file, tmp))


def _checked_file(file: Path) -> Path:
    if not file.exists():
        raise ModelFileError(f"model.path {str(file)!r}: no such file")
    if not file.is_file():
        raise ModelFileError(f"model.path {str(file)!r} ends in .gguf but is not a file")
    with open(file, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelFileError(
            f"model.path {str(file)!r} is not a GGUF file (it starts with {magic!r}, not {_GGUF_MAGIC!r})"
        )
    return file.resolve()


def _file_sha256(file: Path) -> str:
    stat = file.stat()
    memo_key = (str(file), stat.st_size, stat.st_mtime_ns)
    if memo_key not in _hashes:
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        _hashes[memo_key] = digest.hexdigest()
    return _hashes[memo_key]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def gguf_architecture(file: Path) -> str:
    """The file's `general.architecture` (llama, qwen2, ...), read with the `gguf` package."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise MissingPackageError(
            f"loading the GGUF file {str(file)!r} needs the gguf package: pip install 'areal_nb[gguf]' "
            "(or pip install gguf)"
        ) from exc
    field = GGUFReader(file).get_field("general.architecture")
    if field is None:
        raise ModelFileError(f"{str(file)!r}: the GGUF file names no general.architecture")
    return str(field.contents())


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers converts to its own models."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def _convert_gguf(file: Path, out_dir: Path) -> None:
    """Dequantize `file` into a float32 model and save it with its tokenizer as a plain folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    architecture = gguf_architecture(file)
    supported = supported_architectures()
    if architecture not in supported:
        raise ModelFileError(
            f"{str(file)!r}: transformers {_transformers_version()} cannot read the GGUF architecture "
            f"{architecture!r}; it reads {', '.join(supported)}. Convert the model to a Hugging Face "
            "folder another way and set model.path to that folder"
        )
    print(
        f"converting {file.name} ({architecture}) to a float32 Hugging Face folder …",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32, **_dequantized()
    )
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    _drop_quantization(model, file)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "source": str(file),
        "sha256": _file_sha256(file),
        "architecture": architecture,
        "transformers": _transformers_version(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "convert_seconds": round(time.perf_counter() - start, 1),
    }
    (out_dir / _BUILD_INFO).write_text(json.dumps(info, indent=1))


def _dequantized() -> dict:
    """Ask transformers for dense weights (newer releases otherwise keep some GGUF blocks packed)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # releases before GgufConfig always unpack
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantization(model, file: Path) -> None:
    """Forget that the weights came from GGUF: they are plain float tensors now, and the marker
    would make `save_pretrained` refuse (or write a config that looks for the file again)."""
    import torch

    packed = sorted({str(p.dtype) for p in model.parameters() if not torch.is_floating_point(p)})
    if packed:
        raise ModelFileError(
            f"{str(file)!r}: transformers {_transformers_version()} left weights of dtype {packed} "
            "packed; areal_nb trains dense float weights"
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False

"""The built-in models as the package ships them: built once by the recipe, the same bits everywhere.

Why they are shipped and not built on each machine: the warm start's float sums go through the
CPU's kernels (ATen's vector code for AVX2 / AVX-512, MKL's matmuls, each picked at run time),
and 500 SFT steps amplify their last-bit differences into another model. On one machine, one
thread, same seed: with ATen forced to its scalar kernels (`ATEN_CPU_CAPABILITY=default`) even
the random init differs, and with MKL in its reproducible mode (`MKL_CBWR=COMPATIBLE`) the weights
differ after 40 steps. Full builds of the one recipe on three x86 machines answered 0.295, 0.465
and 0.545 of the held-out problems. A bit-reproducible build would have to give up every vendor
kernel and pin the libraries' versions (the tokenizer trainer's too); two ~4.5 MB float32
safetensors files are cheaper.

`shipped/<name>/` holds what `save_pretrained` writes (config, `model.safetensors`, tokenizer,
chat template) and `build_info.json`: the recipe, the measured held-out score, `recipe_key` (the
hash of the recipe and of the code that builds it, as the cache uses: comments, docstrings and
layout do not count, so rewording or reformatting those files keeps the shipped models) and `weights_sha256`.

A shipped folder is used only while its `recipe_key` equals the current code's: after an edit
of the recipe, the data generators or the builder, the model is built on first use into the cache
as before (with a line saying so), and `tests/models/test_shipped.py` fails until
`areal-nb build-models` has rebuilt the shipped files (then commit them, and the new hash).
A refactor may re-key the shipped models instead (change `recipe_key` and nothing else) only after
a same-bits check: `python benchmarks/same_bits.py --base <commit> --rekey` builds the old and the
new code on one machine and re-keys only when every built file is byte for byte the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from areal_nb.errors import InvalidArgumentError

SHIPPED_ROOT = Path(__file__).parent / "shipped"
_said_stale: set[tuple[str, str]] = set()


def shipped_root() -> Path:
    return SHIPPED_ROOT


def recorded_info(name: str) -> dict | None:
    """The shipped folder's `build_info.json`, or None when nothing is shipped for `name`."""
    info = shipped_root() / name / "build_info.json"
    return json.loads(info.read_text()) if info.is_file() else None


def shipped_folder(name: str, current_key: str) -> Path | None:
    """The shipped folder of `name` if it was built from the recipe whose key is `current_key`."""
    info = recorded_info(name)
    if info is None:
        return None
    if info.get("recipe_key") == current_key:
        return shipped_root() / name
    if (name, current_key) in _said_stale:
        return None
    _said_stale.add((name, current_key))
    print(
        f"the shipped {name} was built from another recipe (recorded key {info.get('recipe_key')}, "
        f"this code's {current_key}): building it here instead; `areal-nb build-models` rebuilds "
        "the shipped files",
        file=sys.stderr,
        flush=True,
    )
    return None


def weights_sha256(model) -> str:
    """SHA-256 over the parameters (name, dtype, shape, bytes; tied weights once), in name order."""
    import torch

    h = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        tensor = param.detach().cpu().contiguous()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        h.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def machine() -> dict:
    """What built the files: the figures in build_info.json hold for these kernels."""
    import tokenizers
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }


def build(names: list[str], out_root: Path) -> dict[str, dict]:
    """Build `names` from scratch (tokenizers included) by the recipe into `out_root/<name>/`.

    Each folder is written beside its destination and swapped in only when complete. Returns each
    model's build_info (with `recipe_key`, `weights_sha256` and the machine added).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from . import registry
    from .tiny_tools import build_tools_model, build_tools_tokenizer
    from .tokenizer import build_tokenizer
    from .warm_start import build_model

    out_root.mkdir(parents=True, exist_ok=True)
    infos = {}
    with tempfile.TemporaryDirectory(prefix="areal-nb-build-") as scratch_name:
        scratch = Path(scratch_name)
        math_tokenizer = scratch / "tiny-math-tokenizer"
        build_tokenizer(math_tokenizer)
        for name in names:
            work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out_root))
            try:
                if name == registry.TINY_MATH:
                    info = build_model(work, math_tokenizer)
                elif name == registry.TINY_TOOLS:
                    tools_tokenizer = scratch / "tiny-tools-tokenizer"
                    build_tools_tokenizer(tools_tokenizer, math_tokenizer)
                    info = build_tools_model(work, tools_tokenizer)
                else:
                    raise InvalidArgumentError(
                        f"unknown built-in model {name!r}; expected one of {registry.BUILT_IN_NAMES}"
                    )
                model = AutoModelForCausalLM.from_pretrained(str(work), dtype=torch.float32)
                info |= {
                    "recipe_key": registry.recipe_key(name),
                    "weights_sha256": weights_sha256(model),
                    "built_with": machine(),
                }
                (work / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
                final = out_root / name
                if final.exists():
                    shutil.rmtree(final)
                os.rename(work, final)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
            infos[name] = info
    return infos

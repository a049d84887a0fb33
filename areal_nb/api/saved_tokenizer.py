"""`load_saved_tokenizer(folder)`: a tokenizer folder loaded as it was saved.

Why not plain `AutoTokenizer.from_pretrained`: transformers >= 5 gives every folder whose
config.json says `model_type: qwen2` a `Qwen2Tokenizer`, whatever `tokenizer_config.json`
declares, and `Qwen2Tokenizer` rebuilds the pre-tokenizer with Qwen's word-splitting regex (and an
NFC normalizer) instead of the one in `tokenizer.json`. Vocabulary, special tokens, chat template
and decoding stay the same; encoding does not, for a tokenizer whose merges cross spaces — the
built-in `tiny-tools` one: a tool conversation is 68 tokens as saved, ~3x that re-split. A folder
that declares a plain tokenizers backend is therefore loaded with exactly its `tokenizer.json`.
Both the engine (its fallback tokenizer) and `areal_nb.models.load_tokenizer` use this.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

_PLAIN_BACKENDS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _declares_plain_backend(folder: str | os.PathLike) -> bool:
    """True when `folder` holds a tokenizer.json and its tokenizer_config.json names a plain backend."""
    config = Path(folder).expanduser() / "tokenizer_config.json"
    if not (config.is_file() and (config.parent / "tokenizer.json").is_file()):
        return False
    try:
        declared = json.loads(config.read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return False
    return declared in _PLAIN_BACKENDS


def load_saved_tokenizer(name_or_path: str | os.PathLike) -> Any:
    """The tokenizer of a folder (as saved, see the module docstring) or a Hugging Face id."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if _declares_plain_backend(name_or_path):
        return PreTrainedTokenizerFast.from_pretrained(str(name_or_path))
    return AutoTokenizer.from_pretrained(str(name_or_path))

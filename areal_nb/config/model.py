"""`model`: the policy that is trained and served."""

from __future__ import annotations

from typing import Literal

from .section import Section


class ModelConfig(Section):
    """`model`: the policy that is trained and served."""

    path: str = "tiny-math"
    """A built-in model ("tiny-math", "tiny-tools"), a local directory, a `.gguf` file (converted
    once to a cached float32 Hugging Face folder; needs the `gguf` package) or a Hugging Face id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The compute dtype: the actor's forward and backward (autocast; FSDP2's param_dtype) and the
    weights the engine serves. The trained weights and AdamW's state stay float32 (master weights,
    `areal_nb.train.precision`), so updates at small learning rates do not round away."""
    device: str | None = None
    """Where the actor trains ("cpu", "cuda", "cuda:1"); None: cuda if available, else cpu."""

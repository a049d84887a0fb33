"""Mixed precision: float32 master weights, forward and backward in the compute dtype.

A bfloat16 parameter holds 8 significant bits: at lr 1e-6 almost every AdamW update is below
half a step of the weight it changes and rounds away, so a policy trained in bf16 barely moves.
The field's answer, kept here: the trainable parameters and the optimizer state stay float32
(the master weights), and only the computation runs in the compute dtype (`model.dtype`):

- one process or DDP: `torch.autocast` around the forwards (matmuls in the compute dtype,
  reductions and norms in float32); the backward follows the forward's dtypes, and each
  parameter's gradient arrives in float32;
- FSDP2: `MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=float32)`: each unit gathers
  its weights in the compute dtype, and gradients are reduce-scattered in float32;
- the engine samples with weights cast to its serving dtype at each push (`serving_weights`);
- the KL reference model trains nothing and is kept in the compute dtype.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from areal_nb.errors import InvalidArgumentError

_MASTER_DTYPE = torch.float32


def floating_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of `model`'s floating-point parameters (float32 if it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), _MASTER_DTYPE)


def to_master_weights(model: torch.nn.Module) -> None:
    """Keep `model`'s parameters and buffers in float32 (in place; a no-op for a float32 model)."""
    if any(
        t.is_floating_point() and t.dtype != _MASTER_DTYPE for t in [*model.parameters(), *model.buffers()]
    ):
        model.to(_MASTER_DTYPE)


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """Forwards inside compute in `dtype` (None or float32: as the weights are)."""
    if dtype is None or dtype == _MASTER_DTYPE:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def serving_weights(state: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """A state dict with its floating tensors cast to the engine's `dtype` (others as they are)."""
    return {
        k: v.to(dtype) if isinstance(v, Tensor) and v.is_floating_point() else v for k, v in state.items()
    }


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Run each decoder layer of `model.model.layers` as a `torch.utils.checkpoint` segment: its
    forward keeps only its inputs, the backward recomputes it. (Transformers' own switch,
    `gradient_checkpointing_enable`, acts only in train mode, and the actor runs in eval mode so
    that dropout cannot make π_θ differ from the policy that sampled.) The recomputation runs
    the attention implementation the forward ran (the tree attention is switched on only for
    the forward); under no_grad a layer runs its plain forward."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise InvalidArgumentError(
            f"actor.gradient_checkpointing needs a decoder's model.layers; {type(model).__name__} has none"
        )
    for layer in layers:
        if not getattr(layer, "_areal_checkpointed", False):
            layer.forward = functools.partial(_checkpointed, layer.forward, model.config)
            layer._areal_checkpointed = True


def _checkpointed(forward: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    implementation = config._attn_implementation

    def run(*args: Any, **kwargs: Any) -> Any:
        previous = config._attn_implementation
        config._attn_implementation = implementation
        try:
            return forward(*args, **kwargs)
        finally:
            config._attn_implementation = previous

    return checkpoint(run, *args, use_reentrant=False, **kwargs)

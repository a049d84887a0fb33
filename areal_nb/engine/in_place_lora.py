"""A LoRA policy served from the trainer's own tensors (`api.InPlaceAdapters`): each adapted
linear module computes base(x) + scaling · B(A(x)), with no merged copy of the weights.

An engine that shares the trainer's parameters (`LocalEngine(share_weights=True)`) already runs
on the frozen base; the adapters come as the trainer's lora_A / lora_B tensors themselves. So a
push copies nothing and merges nothing: it is a version change, made while the engine is paused
(the optimizer writes the adapter tensors in place), after which the engine rebuilds only what it
derives from the adapters (the lean forward's stacked low-rank factors, a few MB).

- The stock forward gets one forward hook per adapted module, with peft's arithmetic
  (`lora.Linear.forward`: the base layer's output plus lora_B(lora_A(x)) * scaling), reading the
  live tensors.
- The lean forward (`lean_forward`) fuses q|k|v and gate|up into one projection each; its
  low-rank term is fused the same way (`fused_low_rank`): the adapters' A stacked, their B laid
  out block-diagonally (each times its scaling), so a fused projection costs two small matmuls
  more, not two per module.

The merged path stays wherever the engine cannot read the trainer's tensors: another device or
dtype (it keeps a copy in its own), one engine per agent (`agent_engines`: one policy each),
servers (another process), and adapters on modules other than linear layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from areal_nb.api import InPlaceAdapters, LowRankAdapter
from areal_nb.errors import WeightUpdateError


class LowRank(NamedTuple):
    """A fused projection's low-rank term: `out + alpha · (x aᵀ) bᵀ`, x [N, in]."""

    a: torch.Tensor  # [R, in]
    b: torch.Tensor  # [out, R]
    alpha: float

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out.addmm_(F.linear(x, self.a), self.b.t(), alpha=self.alpha)


def fused_low_rank(
    adapters: list[LowRankAdapter | None], widths: list[int], first_scale: float = 1.0
) -> LowRank | None:
    """The low-rank term of a projection fusing modules of output `widths` (in that order), each
    with its adapter or None; the first module's term times `first_scale` (as its fused weight,
    `lean_forward._fuse`). One module: its own tensors, no copy. Several: A stacked [Σr, in] and
    B block-diagonal [Σwidths, Σr], each block times its scaling (copies rebuilt at every push)."""
    present = [(i, adapter) for i, adapter in enumerate(adapters) if adapter is not None]
    if not present:
        return None
    if len(adapters) == 1:
        adapter = present[0][1]
        return LowRank(adapter.a.detach(), adapter.b.detach(), adapter.scaling * first_scale)
    a = torch.cat([adapter.a.detach() for _, adapter in present])
    b = a.new_zeros(sum(widths), a.shape[0])
    starts = [sum(widths[:i]) for i in range(len(widths))]
    column = 0
    for i, adapter in present:
        rank = adapter.a.shape[0]
        scale = adapter.scaling * (first_scale if i == 0 else 1.0)
        b[starts[i] : starts[i] + widths[i], column : column + rank] = adapter.b.detach() * scale
        column += rank
    return LowRank(a, b, 1.0)


def check_in_place_adapters(
    model: torch.nn.Module, adapters: InPlaceAdapters, shares_weights: bool, covered: set[str] | None
) -> None:
    """Raise WeightUpdateError unless `model` (the engine's) can serve `adapters` in place: it
    shares the trainer's weights, every name is a linear module of it (one the lean forward walks,
    `covered`, when it runs one) and every adapter fits that module, on its device, in its dtype."""
    if not shares_weights:
        raise WeightUpdateError(
            "update_weights: adapters are served in place only by an engine that serves the trainer's "
            "parameters themselves (share_weights=True, same device and dtype); push base + ΔW merged"
        )
    if not isinstance(adapters.modules, Mapping) or not adapters.modules:
        raise WeightUpdateError("update_weights: InPlaceAdapters names no adapted module")
    modules = dict(model.named_modules())
    for name, adapter in adapters.modules.items():
        module = modules.get(name)
        if not isinstance(module, torch.nn.Linear):
            raise WeightUpdateError(f"update_weights: {name!r} is not a linear module of the engine's model")
        if covered is not None and name not in covered:
            raise WeightUpdateError(
                f"update_weights: the engine's lean forward does not compute {name!r} as a module of "
                "its own: its adapter cannot be served in place"
            )
        a, b = adapter.a, adapter.b
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2:
            raise WeightUpdateError(f"update_weights: {name!r}'s adapter is not two matrices")
        rank = a.shape[0]
        if tuple(a.shape) != (rank, module.in_features) or tuple(b.shape) != (module.out_features, rank):
            raise WeightUpdateError(
                f"update_weights: {name!r} maps {module.in_features} -> {module.out_features}; its adapter "
                f"has A {list(a.shape)}, B {list(b.shape)}"
            )
        weight = module.weight
        if any(t.dtype != weight.dtype or t.device != weight.device for t in (a, b)):
            raise WeightUpdateError(
                f"update_weights: {name!r}'s adapter must be {weight.dtype} on {weight.device}, as its weight"
            )


class AdapterHooks:
    """The stock forward's adapters: a forward hook on each adapted module of the engine's model
    (its own modules, never the trainer's), re-attached at each push."""

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def attach(self, model: torch.nn.Module, adapters: Mapping[str, LowRankAdapter]) -> None:
        self.detach()
        modules = dict(model.named_modules())
        for name, adapter in adapters.items():
            self._handles.append(modules[name].register_forward_hook(partial(_add_adapter, adapter)))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _add_adapter(
    adapter: LowRankAdapter, module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor
) -> torch.Tensor:
    # peft's `lora.Linear.forward` (no dropout): result + lora_B(lora_A(x)) * scaling
    return output + F.linear(F.linear(args[0], adapter.a), adapter.b) * adapter.scaling

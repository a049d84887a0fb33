"""The Actor's checkpoint state: its weights (LoRA: the adapters only), optimizer state, version
and step count, gathered full from the shards and cut back to them on load; the KL reference's
weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from .distributed import full_state_dict, shard_like
from .lora import load_adapter_state

if TYPE_CHECKING:
    from .actor import Actor

__all__ = [
    "load_adapter_weights",
    "load_optimizer_state_dict",
    "load_ref_weights",
    "load_state_dict",
    "ref_weights",
    "state_dict",
]


def state_dict(actor: Actor) -> dict[str, Any]:
    """`Actor.state_dict`: weights (LoRA: adapters), optimizer state, version and step count, full."""
    optimizer = actor.optimizer.state_dict()
    return {
        "model": actor.adapter_weights() if actor.lora else actor.weights(),
        "optimizer": full_state_dict(optimizer) if actor.sharded else optimizer,
        "version": actor.version,
        "steps_done": actor.steps_done,
    }


def load_state_dict(actor: Actor, state: dict[str, Any]) -> None:
    """`Actor.load_state_dict`: restore `state_dict`'s full tensors into this rank's shards."""
    if actor.lora:
        actor.load_adapter_weights(state["model"])
    else:
        actor.model.load_state_dict(
            shard_like(state["model"], actor.model.state_dict()) if actor.sharded else state["model"]
        )
    actor.load_optimizer_state_dict(state["optimizer"])
    actor.version = int(state["version"])
    actor.steps_done = int(state.get("steps_done", 0))


def load_adapter_weights(actor: Actor, adapters: dict[str, Tensor]) -> None:
    """`Actor.load_adapter_weights`: restore the full adapter tensors into this rank's shards."""
    own = actor.model.state_dict()
    load_adapter_state(actor.model, shard_like(adapters, own) if actor.sharded else adapters)


def ref_weights(actor: Actor) -> dict[str, Tensor] | None:
    """`Actor.ref_weights`: the KL reference's full weights, or None."""
    if actor.ref_model is None:
        return None
    state = actor.ref_model.state_dict()
    return full_state_dict(state) if actor.sharded else state


def load_ref_weights(actor: Actor, state: dict[str, Tensor]) -> None:
    """`Actor.load_ref_weights`: restore the KL reference's full tensors into this rank's shards."""
    if actor.ref_model is None:
        raise InvalidArgumentError("this Actor has no reference model (actor.kl_ctl is 0)")
    actor.ref_model.load_state_dict(
        shard_like(state, actor.ref_model.state_dict()) if actor.sharded else state
    )


def load_optimizer_state_dict(actor: Actor, state: dict[str, Any]) -> None:
    """`Actor.load_optimizer_state_dict`: the optimizer's full state, cut to this rank's shards."""
    if actor.sharded:  # Adam's moments are shaped like their parameters: shard them alike
        state = {
            **state,
            "state": {
                i: {
                    k: shard_like(v, actor.params[i]) if _shaped_like(v, actor.params[i]) else v
                    for k, v in moments.items()
                }
                for i, moments in state["state"].items()
            },
        }
    actor.optimizer.load_state_dict(state)


def _shaped_like(value: Any, param: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == param.shape

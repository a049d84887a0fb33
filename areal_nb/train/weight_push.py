"""Weights out of the Actor: pushed to the engine that samples (full, merged with the LoRA ΔW, or
the adapters alone; one policy per agent with agent adapters), or served in place (the full
parameters, or the frozen base and the LoRA adapter tensors), the engine paused while an
optimizer step writes the parameters it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from areal_nb.api import AgentWeights, InferenceEngine, InPlaceAdapters
from areal_nb.errors import InvalidArgumentError

from .distributed import full_state_dict
from .lora import (
    adapter_state,
    in_place_adapters,
    lora_adapter,
    lora_base,
    merged_weights,
    use_adapter,
)
from .precision import serving_weights

if TYPE_CHECKING:
    from .actor import Actor

__all__ = [
    "adapter_weights",
    "agent_adapter",
    "pause_in_place_engine",
    "policy_weights",
    "publish_in_place",
    "push_weights",
    "resume_in_place_engine",
    "serve_in_place",
    "weights",
]


def serve_in_place(actor: Actor, engine: InferenceEngine) -> None:
    """`Actor.serve_in_place`: the engine serves the parameters themselves, paused during each
    optimizer step. LoRA: the frozen base and the adapter tensors, attached here."""
    if actor.agents or actor.parallel is not None:
        raise InvalidArgumentError(
            "an engine serves the Actor's parameters in place only for one policy (no agent adapters: "
            "an engine per agent, each pushed its merged weights) and without data parallelism "
            "(it is pushed gathered weights there)"
        )
    served = _served_weights(actor)  # (refuses adapters it cannot serve in place, before any change)
    actor.in_place_engine = engine
    if actor.lora:
        _update_in_place(actor, served, engine.get_version())


def pause_in_place_engine(actor: Actor) -> None:
    engine = actor.in_place_engine
    if engine is not None and not actor._paused_engine:
        engine.pause()  # (returns once no decoding step runs)
        actor._paused_engine = True


def publish_in_place(actor: Actor, version: int) -> None:
    """The in-place engine's version moves to `version` while it is paused (no copy: its
    weights are these)."""
    if actor.in_place_engine is not None and actor._paused_engine:
        _update_in_place(actor, _served_weights(actor), version)


def resume_in_place_engine(actor: Actor) -> None:
    if actor._paused_engine:
        actor._paused_engine = False
        assert actor.in_place_engine is not None
        actor.in_place_engine.resume()


def _update_in_place(actor: Actor, served: dict[str, Tensor] | InPlaceAdapters, version: int) -> None:
    assert actor.in_place_engine is not None
    actor.in_place_engine.update_weights(served, version=version)
    actor.in_place_written = _writes(served)


def _writes(served: dict[str, Tensor] | InPlaceAdapters) -> tuple[int, ...] | None:
    """LoRA in place: the in-place write counts of the adapter tensors (an optimizer step or a
    loaded checkpoint moves them), so a push at an unchanged version still reaches the engine's
    copies of them where they changed. Full weights: None (a push at the same version changes
    nothing there)."""
    if not isinstance(served, InPlaceAdapters):
        return None
    return tuple(t._version for adapter in served.modules.values() for t in (adapter.a, adapter.b))


def _served_weights(actor: Actor) -> dict[str, Tensor] | InPlaceAdapters:
    """What the in-place engine serves: the parameters themselves (`serving_weights` casts
    nothing, they are in the engine's dtype); LoRA: the adapter tensors themselves (the engine
    already holds the base)."""
    if actor.lora:
        return in_place_adapters(actor.model)
    return serving_weights(actor.model.state_dict(), actor.compute_dtype)


def push_weights(actor: Actor, engine: InferenceEngine | None, version: int | None = None) -> int:
    """`Actor.push_weights`: full, merged or adapter weights to `engine` (serving in place: only
    its version moves)."""
    version = actor.version if version is None else version
    if engine is not None and engine is actor.in_place_engine:
        served = _served_weights(actor)
        if engine.get_version() != version or _writes(served) != actor.in_place_written:
            _update_in_place(actor, served, version)
        return version
    if actor.agents:
        if engine is None:
            return version
        if engine.serves_lora_adapters:  # servers apply each agent's adapter
            per_agent = {a: actor.agent_adapter(a) for a in actor.agents}
        else:  # each agent's embedded engine serves base + its ΔW merged (engine.agent_engines)
            per_agent = {
                a: serving_weights(actor.policy_weights(a), actor.compute_dtype) for a in actor.agents
            }
        engine.update_weights(AgentWeights(per_agent), version=version)
        return version
    serves_adapters = actor.lora and engine is not None and engine.serves_lora_adapters
    if actor.lora and actor.sharded:  # every rank takes part in the same gathers: rank 0's engine decides
        assert actor.parallel is not None
        serves_adapters = actor.parallel.broadcast(serves_adapters)
    elif engine is None and not actor.sharded:  # (a DDP replica: nothing to gather or send)
        return version
    if serves_adapters:
        # LoRA on servers that apply adapters themselves: the adapter alone (peft's files)
        adapter = lora_adapter(actor.model, actor.adapter_weights() if actor.sharded else None)
        if engine is not None:
            engine.update_weights(adapter, version=version)
        return version
    # LoRA otherwise: the engine serves base + ΔW merged (its forward stays the plain model's),
    # where it cannot read the trainer's tensors: another device or dtype, or another process
    weights = serving_weights(actor.policy_weights(), actor.compute_dtype)
    if engine is not None:
        engine.update_weights(weights, version=version)
    return version


def weights(actor: Actor) -> dict[str, Tensor]:
    """`Actor.weights`: the model's full weights (sharded: a gather every rank calls)."""
    return full_state_dict(actor.model.state_dict()) if actor.sharded else actor.model.state_dict()


def policy_weights(actor: Actor, agent: str | None = None) -> dict[str, Tensor]:
    """`Actor.policy_weights`: the weights the engine serves (LoRA: ΔW merged; agent adapters: `agent`'s)."""
    if not actor.lora:
        return actor.weights()
    if actor.agents:
        use_adapter(actor.model, _known_agent(actor, agent))
        return merged_weights(actor.model)
    base = lora_base(actor.model).state_dict()
    return merged_weights(actor.model, state=full_state_dict(base) if actor.sharded else None)


def agent_adapter(actor: Actor, agent: str) -> Any:
    """`Actor.agent_adapter`: `agent`'s adapter as peft saves it."""
    use_adapter(actor.model, _known_agent(actor, agent))
    return lora_adapter(actor.model)


def _known_agent(actor: Actor, agent: str | None) -> str:
    if agent not in actor.agents:
        raise InvalidArgumentError(
            f"this Actor trains one adapter per agent: name one of {actor.agents}, got {agent!r}"
        )
    assert agent is not None
    return agent


def adapter_weights(actor: Actor) -> dict[str, Tensor]:
    """`Actor.adapter_weights`: the adapter tensors, full."""
    adapters = adapter_state(actor.model.state_dict())
    return full_state_dict(adapters) if actor.sharded else adapters

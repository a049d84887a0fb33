"""`AgentEngines`: one embedded engine per agent, for agents that train their own LoRA adapter.

With the Session's `agents: {name: {lora: ...}}`, each agent is its own policy: one frozen base,
one adapter per agent. The embedded engine serves base + ΔW merged into its weights, so it can
serve one policy at a time; here each agent gets an engine of its own (its own copy of the
weights, its own continuous batch, its own prefix cache: KV computed under one adapter is wrong
under another), and a request goes to the engine of the agent that made it (`ModelRequest.agent`,
the `model` name the call sent). The agents' calls then batch and run side by side, none waits
for another's batch to drain. The price is one copy of the model per agent.

The trainer pushes `AgentWeights` (each agent's merged weights); a plain state dict (the base)
goes to every engine. All engines carry one policy version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from areal_nb.api import AgentWeights, InferenceEngine, ModelRequest, ModelResponse
from areal_nb.errors import CheckpointError, InvalidArgumentError, UnknownAgentError, WeightUpdateError

__all__ = ["AgentEngines", "UnknownAgentError"]


class AgentEngines(InferenceEngine):
    """Several engines behind the `InferenceEngine` interface, one per agent (module docstring)."""

    # capabilities: each agent's engine serves base + its ΔW merged (and the base's weights, as
    # given); the others are what every agent's engine can do (set per instance)
    serves_lora_adapters = False
    weights_may_differ = False
    shares_weights = False  # (each holds its own merged copy)

    def __init__(self, engines: Mapping[str, InferenceEngine]) -> None:
        if not engines:
            raise InvalidArgumentError("AgentEngines needs at least one agent's engine")
        self.engines = dict(engines)
        contexts = {e.max_context for e in self.engines.values()}
        self.max_context = min((c for c in contexts if c is not None), default=None)
        self.records_sampling_masks = all(e.records_sampling_masks for e in self.engines.values())
        self.serves_models_in_process = all(e.serves_models_in_process for e in self.engines.values())
        self.stats = None  # each engine keeps its own (`engines[agent].stats`)

    @property
    def agents(self) -> list[str]:
        return list(self.engines)

    def engine_for(self, agent: str | None) -> InferenceEngine:
        """The engine of `agent`; UnknownAgentError (400) names the agents that have one."""
        engine = self.engines.get(agent) if agent is not None else None
        if engine is None:
            raise UnknownAgentError.of(agent, self.engines)
        return engine

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        return await self.engine_for(req.agent).agenerate(req)

    def get_version(self) -> int:
        return next(iter(self.engines.values())).get_version()

    def _on_every_engine(self, call: Callable[[InferenceEngine], object]) -> None:
        for engine in self.engines.values():
            call(engine)

    def set_version(self, version: int) -> None:
        self._on_every_engine(lambda engine: engine.set_version(version))

    def pause(self) -> None:
        self._on_every_engine(lambda engine: engine.pause())

    def resume(self) -> None:
        self._on_every_engine(lambda engine: engine.resume())

    def drop_caches(self) -> None:
        self._on_every_engine(lambda engine: engine.drop_caches())

    def update_weights(self, weights: Any, version: int | None = None) -> None:
        """`AgentWeights`: each agent's engine gets its own (every agent must be named, and no
        other); anything else (the base's weights) goes to every engine."""
        if not isinstance(weights, AgentWeights):
            self._on_every_engine(lambda engine: engine.update_weights(weights, version=version))
            return
        if set(weights.per_agent) != set(self.engines):
            raise WeightUpdateError(
                f"AgentWeights names agents {sorted(weights.per_agent)}, the engines serve "
                f"{sorted(self.engines)}: push every agent's weights at once"
            )
        for agent, engine in self.engines.items():
            engine.update_weights(weights.per_agent[agent], version=version)

    def abort(self, rid: str) -> None:
        self._on_every_engine(lambda engine: engine.abort(rid))

    def abort_all(self) -> None:
        self._on_every_engine(lambda engine: engine.abort_all())

    def close(self) -> None:
        errors = []
        for engine in self.engines.values():  # every engine is closed, even if one fails
            try:
                engine.close()
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others closed
                errors.append(exc)
        if errors:
            raise errors[0]

    def rng_state(self) -> Any:
        return {agent: engine.rng_state() for agent, engine in self.engines.items()}

    def set_rng_state(self, state: Any) -> None:
        if state is None:
            return
        if not isinstance(state, dict) or set(state) != set(self.engines):
            raise CheckpointError(
                f"the saved sampler state is not one per agent ({sorted(self.engines)}): "
                "was it saved with another `agents` config?"
            )
        for agent, engine in self.engines.items():
            engine.set_rng_state(state[agent])

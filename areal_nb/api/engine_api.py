"""The interface every inference engine (LocalEngine, SGLangEngine, test engines) provides.

Everything the layers above call on an engine is declared here: generation, the policy version,
pausing, weight updates, closing, the context length the capture layer and the proxy's body limit
size requests by, and the sampler's RNG state a checkpoint keeps.

Below those, the capabilities: what an engine can do beyond generating, each with the plainest
engine's default (`max_context` unknown, no adapters served, nothing to abort, ...). Callers read
them as declared here and never probe an engine with `getattr`/`hasattr`; every engine of the
package subclasses `InferenceEngine` and states each capability's value for itself.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .io_struct import ModelRequest, ModelResponse


@runtime_checkable
class InferenceEngine(Protocol):
    async def agenerate(self, req: ModelRequest) -> ModelResponse: ...

    def get_version(self) -> int: ...

    def set_version(self, version: int) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def update_weights(self, weights: Any, version: int | None = None) -> None: ...

    def close(self) -> None: ...

    def rng_state(self) -> Any:
        """The sampler's RNG state for a checkpoint, or None where sampling happens elsewhere."""
        ...

    def set_rng_state(self, state: Any) -> None:
        """Restore what `rng_state` returned (None: nothing to restore)."""
        ...

    # ------------------------------------------------------------------ capabilities
    # The model's context length (prompt + output tokens), or None where the engine does not know it.
    max_context: int | None = None
    # Applies LoRA adapters itself: the trainer pushes its adapter (`LoraAdapter`, or one per agent
    # in `AgentWeights`) instead of base + ΔW merged into full weights.
    serves_lora_adapters: bool = False
    # Serves weights that may differ from the policy it was made from (servers someone else
    # started): the Session pushes the trainer's weights once, before anything is generated.
    weights_may_differ: bool = False
    # Records the set each sampled token was drawn among (grammar, top-k, top-p), which
    # `actor.replay_sampling_masks` replays in the trainer.
    records_sampling_masks: bool = False
    # Generates in this process from a model object it is given (a frozen copy of the policy can
    # be served by another engine of its kind: `judge(engine="initial")`).
    serves_models_in_process: bool = False
    # Serves the trainer's parameters themselves, not a copy (`LocalEngine(share_weights=True)`):
    # the Actor pauses it around the optimizer's in-place writes (`Actor.serve_in_place`).
    shares_weights: bool = False
    # The engine's counters (a dataclass the engine-server reports in /get_server_info), or None.
    stats: Any = None

    def abort(self, rid: str) -> None:
        """Stop request `rid` early (partial output, stop reason "abort"); an engine that cannot
        stop a request lets it finish."""
        return None  # (a body, not `...`: the default is inherited, not left to implement)

    def drop_caches(self) -> None:
        """Free what the engine keeps only to be faster (copies of the weights laid out for its
        kernels, finished requests' keys/values) if no request is in flight; they are rebuilt as
        requests come. Called before a train step, whose weight update makes them stale anyway;
        an engine with nothing to free does nothing."""
        return None

    def abort_all(self) -> None:
        """Stop every request in flight (as `abort`); an engine that cannot lets them finish."""
        return None

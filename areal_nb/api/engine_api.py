"""The interface every inference engine (LocalEngine, SGLangEngine, test engines) provides.

Everything the layers above call on an engine is declared here: generation, the policy version,
pausing, weight updates, closing, the context length the capture layer and the proxy's body limit
size requests by, and the sampler's RNG state a checkpoint keeps.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .io_struct import ModelRequest, ModelResponse


@runtime_checkable
class InferenceEngine(Protocol):
    # The model's context length (prompt + output tokens), or None where the engine does not know it.
    @property
    def max_context(self) -> int | None: ...

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

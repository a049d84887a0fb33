"""The interface every inference engine (LocalEngine, SGLangEngine, test engines) provides."""

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

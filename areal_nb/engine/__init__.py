"""Inference engines: `LocalEngine`, the embedded transformers engine with continuous batching.

A scripted engine for tests lives in `areal_nb.testing`.
"""

from .factory import ENGINE_TYPES, create_engine


def __getattr__(name: str):
    # LocalEngine pulls in torch and transformers; import it only when asked for.
    if name in ("LocalEngine", "EngineClosedError", "EngineStats"):
        from . import local

        return getattr(local, name)
    raise AttributeError(f"module 'areal_nb.engine' has no attribute {name!r}")


__all__ = ["ENGINE_TYPES", "EngineClosedError", "EngineStats", "LocalEngine", "create_engine"]

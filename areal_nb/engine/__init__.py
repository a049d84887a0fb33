"""Inference engines: `LocalEngine` (embedded, continuous batching) and `ScriptedEngine` (tests)."""

from .factory import ENGINE_TYPES, create_engine
from .scripted import ScriptedEngine


def __getattr__(name: str):
    # LocalEngine pulls in torch and transformers; import it only when asked for.
    if name in ("LocalEngine", "EngineClosedError", "EngineStats"):
        from . import local

        return getattr(local, name)
    raise AttributeError(f"module 'areal_nb.engine' has no attribute {name!r}")


__all__ = ["ENGINE_TYPES", "EngineClosedError", "EngineStats", "LocalEngine", "ScriptedEngine", "create_engine"]

"""Inference engines: `LocalEngine` (embedded, continuous batching), `SGLangEngine` (client of SGLang
HTTP servers and `areal-nb engine-server`) and `ScriptedEngine` (tests)."""

from .scripted import ScriptedEngine


def __getattr__(name: str):
    # LocalEngine pulls in torch and transformers; import it only when asked for.
    if name in ("LocalEngine", "EngineClosedError", "EngineStats"):
        from . import local

        return getattr(local, name)
    if name in ("SGLangEngine", "EngineServerError", "ServerDownError"):
        from . import remote

        return getattr(remote, name)
    raise AttributeError(f"module 'areal_nb.engine' has no attribute {name!r}")


__all__ = ["EngineClosedError", "EngineServerError", "EngineStats", "LocalEngine", "SGLangEngine", "ScriptedEngine",
           "ServerDownError"]

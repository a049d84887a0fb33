"""Inference engines: `LocalEngine` (embedded transformers engine, continuous batching) and
`SGLangEngine` (client of SGLang HTTP servers and `areal-nb engine-server`).

A scripted engine for tests lives in `areal_nb.testing`.
"""

from .factory import ENGINE_TYPES, create_engine


def __getattr__(name: str):
    # LocalEngine pulls in torch and transformers; import it only when asked for.
    if name in ("LocalEngine", "EngineClosedError", "EngineStats"):
        from . import local

        return getattr(local, name)
    if name in ("SGLangEngine", "EngineServerError", "ServerDownError"):
        from . import remote

        return getattr(remote, name)
    raise AttributeError(f"module 'areal_nb.engine' has no attribute {name!r}")


__all__ = [
    "ENGINE_TYPES",
    "EngineClosedError",
    "EngineServerError",
    "EngineStats",
    "LocalEngine",
    "SGLangEngine",
    "ServerDownError",
    "create_engine",
]

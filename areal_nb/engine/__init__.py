"""Inference engines: `LocalEngine`, the embedded transformers engine with continuous batching.

A scripted engine for tests lives in `areal_nb.testing`.
"""


def __getattr__(name: str):
    # LocalEngine pulls in torch and transformers; import it only when asked for.
    if name in ("LocalEngine", "EngineClosedError", "EngineStats"):
        from . import local

        return getattr(local, name)
    raise AttributeError(f"module 'areal_nb.engine' has no attribute {name!r}")


__all__ = ["EngineClosedError", "EngineStats", "LocalEngine"]

"""`EngineError`'s kinds: an inference engine or its server that cannot serve (closed, down,
failed to start, or refusing a model file, weights or an adapter).
"""

from __future__ import annotations

from .families import EngineError


class ModelFileError(EngineError, ValueError):
    """`model.path` names a file that cannot be loaded: missing, not GGUF, or of an architecture
    transformers does not read from GGUF; the message names the file."""


class ConcatAlignmentError(EngineError, RuntimeError):
    """The full-conversation template could not be aligned with the parent's tokens."""


class EngineClosedError(EngineError, RuntimeError):
    """The engine was closed before (or while) serving the request."""


class EngineServerError(EngineError, RuntimeError):
    """An engine server answered with an error, broke the protocol, or the engine was closed."""


class ServerDownError(EngineServerError):
    """The server that held the request is down (process died, connection lost)."""


class ServerLaunchError(EngineError, RuntimeError):
    """The server process exited (or never became healthy) during start-up."""


class WeightUpdateError(EngineError, ValueError):
    """New weights that do not fit the served model (unknown names, wrong shapes, no files, nowhere
    to write them); the engine keeps the weights it had."""


class BatchShapeError(EngineError, ValueError, RuntimeError):
    """The parts of an engine batch do not match (prompts and prefixes, rows and logits, decode
    tokens and rows): a caller's bug; a ValueError, and a RuntimeError too since decode's was one."""


class LoraError(EngineError, ValueError):
    """A LoRA adapter (or launch flag) the engine-server does not load or serve; its message is
    SGLang's answer to the client."""

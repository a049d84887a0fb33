"""Moved to `areal_nb.engine.server` (a package, one module per job); this path keeps old imports
working (`areal-nb engine-server`'s users, the tests)."""

from areal_nb.errors import BadRequest, BodyError, ContractViolation, HTTPError, render_error

from .server import EngineServerSettings, create_engine_app
from .server.asgi import sglang_error
from .server.gate import ServingState as _ServingState

__all__ = [
    "BadRequest",
    "BodyError",
    "ContractViolation",
    "EngineServerSettings",
    "HTTPError",
    "_ServingState",
    "create_engine_app",
    "render_error",
    "sglang_error",
]

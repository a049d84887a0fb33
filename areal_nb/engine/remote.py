"""Moved to `areal_nb.engine.sglang_client` (a package, one module per job); this path keeps old
imports working (`from areal_nb.engine.remote import SGLangEngine`)."""

from areal_nb.errors import EngineRefused, EngineServerError, ServerDownError, UnknownAgentError

from .sglang_client import (
    UNLOAD_AT_CLOSE_S,
    SGLangEngine,
    load_adapter_body,
    refuse_constraint,
    server_rid,
    unload_adapter_body,
)
from .sglang_wire import generate_payload as _generate_payload

__all__ = [
    "UNLOAD_AT_CLOSE_S",
    "EngineRefused",
    "EngineServerError",
    "SGLangEngine",
    "ServerDownError",
    "UnknownAgentError",
    "_generate_payload",
    "load_adapter_body",
    "refuse_constraint",
    "server_rid",
    "unload_adapter_body",
]

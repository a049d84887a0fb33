"""`SGLangEngine`, the client of SGLang servers (or `areal-nb engine-server`), one module per job.

`engine.py` is the `InferenceEngine` itself (generation, pause, version); `loop.py` the event loop
it owns in a thread of its own; `routing.py` which server a request goes to and which are down;
`transport.py` the HTTP calls (aiohttp for `/generate`, httpx over the same pool for the rest);
`weights.py` pause → update from disk → continue; `adapters.py` LoRA adapters, one per policy or
one per agent. The `/generate` wire itself is `engine/sglang_wire.py`, shared with engine-server.
"""

from .adapters import UNLOAD_AT_CLOSE_S, load_adapter_body, unload_adapter_body
from .engine import SGLangEngine, refuse_constraint
from .routing import server_rid

__all__ = [
    "UNLOAD_AT_CLOSE_S",
    "SGLangEngine",
    "load_adapter_body",
    "refuse_constraint",
    "server_rid",
    "unload_adapter_body",
]

"""The foreground loop shared by the server commands (`areal-nb proxy`, `areal-nb engine-server`)."""

from __future__ import annotations

import signal
import threading
from typing import Any


def serve_until_signal(server: Any, engine: Any, name: str, model: str) -> int:
    """Start `server` (a ProxyServer), wait for SIGINT or SIGTERM, then stop it and close `engine`.

    The previous signal handlers are put back afterwards, so a caller in a larger program keeps its own.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"areal-nb {name} listening on {server.url} (model {model})", flush=True)
        while not stop.wait(0.5):
            pass
        print(f"areal-nb {name}: stopping", flush=True)
    finally:
        server.stop()
        engine.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0

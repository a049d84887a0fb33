"""Weight updates on `SGLangEngine`'s servers: pause → `/update_weights_from_disk` → continue.

`update_weights(weights, version)` writes the weights under `weights_dir` (atomic rename,
`weight_sync.write_weights`) unless given a directory, then pauses every live server (in-flight
requests come back with partial output and are re-sent after the continue, so a caller sees one
response whose per-token versions show both weights), loads the folder with `weight_version`, and
continues. A server that refuses the folder is asked again with backoff for `weights_wait` s (a
folder written on another node may not be visible there yet), then the update fails naming the
path. `SGLangEngine.aupdate_weights` writes the weights; LoRA adapters go through `adapters.py`,
which loads them with the same retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from areal_nb.errors import EngineServerError, ServerDownError

from .routing import Server
from .transport import ServerCalls


class WeightUpdates(ServerCalls):
    """The weight-update half of `SGLangEngine` (a base class of it; its pause, continue and
    version come from the engine)."""

    weights_wait: float
    _version: int
    _update_lock: asyncio.Lock
    apause: Callable[[], Awaitable[None]]
    aresume: Callable[[], Awaitable[None]]

    async def _aupdate_from_disk(self, path: str, version: int | None) -> None:
        body: dict[str, Any] = {"model_path": path, "flush_cache": True, "abort_all_requests": False}
        if version is not None:
            body["weight_version"] = str(int(version))
        # update_weights_from_disk needs no begin/end_weight_update session (only the tensor and
        # distributed updates do in sglang >= 0.5.21; docs/reference/sglang-api.md, "Weight updates")
        async with self._update_lock:  # one update at a time: pause/continue must not interleave
            await self.apause()
            try:
                await self._gather_live(lambda s: self._update_from_disk_on(s, body))
                if version is not None:
                    self._version = int(version)
            finally:
                await self.aresume()

    async def _update_from_disk_on(
        self, server: Server, body: dict[str, Any], route: str = "/update_weights_from_disk"
    ) -> None:
        """`/update_weights_from_disk` (or `/load_lora_adapter`) on one server; a refusal (the
        folder not visible there yet, or not complete) is retried with backoff for `weights_wait`
        s, then raised with the path. A refused update changes nothing on the server (SGLang and
        engine-server keep the old weights, adapters and version), so trying again is safe."""
        deadline = time.monotonic() + self.weights_wait
        delay, attempts = 0.25, 0
        path = body.get("model_path") or body.get("lora_path")
        while True:
            attempts += 1
            try:
                await self._post(server, route, body)
                return
            except ServerDownError:
                raise
            except (ValueError, EngineServerError) as exc:
                if "LoRA is not enabled" in str(exc):  # no retry can change a server's flags
                    raise EngineServerError(
                        f"engine server {server.url} serves no LoRA adapters ({exc}): start it with "
                        "--enable-lora --max-lora-rank R --lora-target-modules ... (engine.type: sglang "
                        "passes them when actor.lora is set)"
                    ) from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineServerError(
                        f"engine server {server.url} refused the {'adapter' if route != '/update_weights_from_disk' else 'weights'} "
                        f"at {path} {attempts} time(s) over {self.weights_wait:g} s; last answer: {exc}"
                    ) from exc
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 8.0)

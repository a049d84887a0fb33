"""LoRA adapters on `SGLangEngine`'s servers (`lora=True`: servers started with `--enable-lora`).

`update_weights` given a `LoraAdapter` (or a peft adapter folder) writes it under `weights_dir` as
`adapter-<v>/` (a few MB), then pause → `/load_lora_adapter` under a name of its own for that
version → `/update_weight_version` → continue on every live server; every request sent afterwards
(the interrupted ones re-sent too) names it in `lora_path`, and the previous version's adapter is
unloaded. Full weights are still the base (`/update_weights_from_disk`); the adapter stays on top.
With one adapter per agent (`AgentWeights` of `LoraAdapter`s) each agent's adapter is written as
`adapter-<agent>-<v>/` and loaded under a name of its own in the same pause, and each request names
the adapter of its agent; a request from another agent is refused (`UnknownAgentError`).
`close()` unloads the adapters this engine loaded from servers someone else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
from collections.abc import Awaitable, Callable
from typing import Any

from areal_nb.api import AgentWeights, LoraAdapter
from areal_nb.errors import LoraError, UnknownAgentError

from ..weight_sync import write_adapter
from .weights import WeightUpdates

# how long close() waits for servers someone else runs to unload this engine's adapters (a server
# answers once no request names the adapter any more)
UNLOAD_AT_CLOSE_S = 10.0


class AdapterUpdates(WeightUpdates):
    """The adapter half of `SGLangEngine` (a base class of it). `_adapter`: the loaded adapter
    every request names (None: the base); `_agent_adapters`: with one adapter per agent, agent →
    loaded name."""

    serves_lora_adapters: bool
    weights_dir: str | os.PathLike | None
    owned_processes: list[Any]
    _version: int
    _rid_prefix: str
    _adapter: str | None
    _agent_adapters: dict[str, str]
    _adapter_count: itertools.count
    _on_loop: Callable[..., Awaitable[Any]]

    async def _aupdate_adapter(self, adapter: LoraAdapter | str | os.PathLike, version: int | None) -> None:
        """The adapter on every live server under a new name, used by every request from now on
        (see the module docstring)."""
        if not self.serves_lora_adapters:
            raise LoraError(
                "this SGLangEngine was not made for LoRA adapters (lora=False): its servers may not "
                "have been started with --enable-lora"
            )
        target = self._version + 1 if version is None else int(version)
        if isinstance(adapter, LoraAdapter):
            if self.weights_dir is None:
                raise LoraError(
                    "SGLangEngine needs weights_dir (a directory the servers share) to push adapters"
                )
            path = str(await asyncio.to_thread(write_adapter, self.weights_dir, target, adapter))
        else:
            path = os.path.abspath(adapter)
        await self._on_loop(self._aload_adapter(path, target))

    async def _aupdate_agent_adapters(self, weights: AgentWeights, version: int | None) -> None:
        """Each agent's adapter on every live server under a new name, each request naming its
        agent's from now on (see the module docstring)."""
        if not self.serves_lora_adapters or self.weights_dir is None:
            raise LoraError(
                "one adapter per agent needs servers that serve LoRA adapters (lora=True) and weights_dir"
            )
        strangers = [a for a, w in weights.per_agent.items() if not isinstance(w, LoraAdapter)]
        if strangers:
            raise LoraError(f"AgentWeights for SGLangEngine hold LoraAdapters; agent(s) {strangers} do not")
        target = self._version + 1 if version is None else int(version)
        weights_dir = self.weights_dir
        paths: dict[str | None, str] = {
            agent: str(await asyncio.to_thread(write_adapter, weights_dir, target, adapter, agent=agent))
            for agent, adapter in weights.per_agent.items()
        }
        await self._on_loop(self._aload_adapters(paths, target))

    async def _aload_adapter(self, path: str, version: int) -> None:
        await self._aload_adapters({None: path}, version)

    async def _aload_adapters(self, paths: dict[str | None, str], version: int) -> None:
        """Load `paths` (agent → adapter folder; None: the one policy's) in one pause; the
        requests sent afterwards name them, and the adapters they replace are unloaded."""
        # a name per push: a version pushed twice (a restored run) never meets its own name
        names = {
            agent: f"{agent or 'policy'}-v{version}-{self._rid_prefix[:8]}-{next(self._adapter_count)}"
            for agent in paths
        }
        set_version = {"new_version": str(version), "abort_all_requests": False}
        async with self._update_lock:
            await self.apause()  # requests in flight come back and are re-sent naming the new adapters
            try:
                for agent, path in paths.items():
                    load = load_adapter_body(names[agent], path)
                    await self._gather_live(
                        functools.partial(self._update_from_disk_on, body=load, route="/load_lora_adapter")
                    )
                await self._gather_live(lambda s: self._post(s, "/update_weight_version", set_version))
                if None in names:
                    previous = [self._adapter] if self._adapter is not None else []
                    self._adapter = names[None]
                else:
                    previous = list(self._agent_adapters.values())
                    self._agent_adapters = {str(a): n for a, n in names.items()}
                self._version = version
            finally:
                await self.aresume()
            for name in previous:  # (the servers answer once no request names it any more)
                unload = unload_adapter_body(name)
                await self._gather_live(
                    functools.partial(self._post, path="/unload_lora_adapter", body=unload)
                )

    def _adapter_of(self, agent: str | None) -> str | None:
        """The adapter a request of `agent` names: its agent's (one adapter per agent, refusing
        other agents), else the one policy's (None: the base)."""
        if not self._agent_adapters:
            return self._adapter
        if agent in self._agent_adapters:
            return self._agent_adapters[agent]
        raise UnknownAgentError.of(agent, self._agent_adapters)

    async def _unload_adapters(self) -> None:
        """Servers someone else runs keep serving after this engine: the adapters it loaded are
        unloaded, so runs that come and go do not fill their adapter memory. Launched servers are
        stopped instead. Best effort, within UNLOAD_AT_CLOSE_S."""
        names = [*([self._adapter] if self._adapter else []), *self._agent_adapters.values()]
        if self.owned_processes or not names:
            return
        unloads = [
            self._post(server, "/unload_lora_adapter", unload_adapter_body(name))
            for name in names
            for server in self.servers
            if server.down is None
        ]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*unloads, return_exceptions=True), UNLOAD_AT_CLOSE_S)
        self._adapter, self._agent_adapters = None, {}


def load_adapter_body(name: str, path: str) -> dict[str, Any]:
    """The `/load_lora_adapter` body: the adapter folder `path` under `name` (SGLang's
    `LoadLoRAAdapterReqInput`; unpinned: SGLang may evict it from its GPU slots when idle)."""
    return {"lora_name": name, "lora_path": path, "pinned": False}


def unload_adapter_body(name: str) -> dict[str, Any]:
    """The `/unload_lora_adapter` body (SGLang's `UnloadLoRAAdapterReqInput`)."""
    return {"lora_name": name}

"""The engine-server's gate: who may enter the engine, and when.

`ServingState` holds the pause gate, SGLang's model-update lock (a weight update waits for the
requests in flight and holds new ones back) and the rids in flight, all on the server's loop;
with LoRA also the adapter gate: one adapter (or the base) in the engine at a time, first come,
first served (`lora_serving.py`). The admission window in front of it (`engine/admission.py`)
lets a burst start as one batch.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from areal_nb.errors import BadRequest

from ..lora_serving import Adapter, AdapterServing


class ServingState:
    """Pause gate, sglang's model-update lock and the in-flight rids, all on the server's loop;
    with LoRA also the adapter gate: one adapter (or the base) in the engine at a time, first
    come, first served (lora_serving.py)."""

    def __init__(self, engine: Any, adapters: AdapterServing | None = None) -> None:
        self.engine = engine
        self.adapters = adapters
        self.cond = asyncio.Condition()
        self.paused = False
        self.updating = False
        self.in_flight: dict[str, int] = {}  # rid → 1 (a dict keeps insertion order for prefix aborts)
        self.held: dict[str, int] = {}  # rids waiting in the admission window, not yet in the engine
        self.aborted_while_held: set[str] = set()  # they answer "abort" without reaching the engine
        self._tickets = itertools.count()
        self.waiting: dict[int, Adapter | None] = {}  # arrival ticket → adapter, while at the gate
        self._notifying: set[asyncio.Task] = set()

    async def admit(self, rids: list[str], adapter: Adapter | None = None) -> None:
        if self.adapters is None:
            async with self.cond:
                await self.cond.wait_for(lambda: not self.paused and not self.updating)
                self._enter(rids)
            return
        ticket = next(self._tickets)
        self.waiting[ticket] = adapter
        entered = False
        try:
            while True:
                async with self.cond:
                    await self.cond.wait_for(lambda: self._may_enter(adapter, ticket))
                    if adapter is self.adapters.applied:
                        self._enter(rids)
                        entered = True
                        return
                    self.updating = True  # the switch: nothing in flight, nobody enters meanwhile
                try:
                    await asyncio.to_thread(self.adapters.switch, adapter)
                finally:
                    async with self.cond:
                        self.updating = False
                        self.cond.notify_all()
        finally:
            del self.waiting[ticket]
            if not entered:  # the requests behind this one may go now
                task = asyncio.get_running_loop().create_task(self.notify())
                self._notifying.add(task)  # (a task nobody holds may be collected before it runs)
                task.add_done_callback(self._notifying.discard)

    def _may_enter(self, adapter: Adapter | None, ticket: int) -> bool:
        if self.paused or self.updating:
            return False
        applied = self.adapters.applied if self.adapters is not None else None
        if adapter is applied:  # unless an earlier request waits for another adapter
            return not any(t < ticket and a is not applied for t, a in self.waiting.items())
        return not self.in_flight and ticket == min(self.waiting)

    def _enter(self, rids: list[str]) -> None:
        duplicates = [r for r in rids if r in self.in_flight or rids.count(r) > 1]
        if duplicates:
            raise BadRequest(f"Duplicate request ID detected: {duplicates[0]!r}")
        for rid in rids:
            self.in_flight[rid] = 1

    async def notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def drop_use(self, adapter: Adapter) -> None:
        async with self.cond:
            assert self.adapters is not None
            self.adapters.uses[adapter] -= 1
            if self.adapters.uses[adapter] <= 0:
                del self.adapters.uses[adapter]
            self.cond.notify_all()

    async def exclusive(self, work: Callable[[], Any]) -> Any:
        """`work()` in a thread while no weight update, adapter load or switch runs."""
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.updating = True
        try:
            return await asyncio.to_thread(work)
        finally:
            async with self.cond:
                self.updating = False
                self.cond.notify_all()

    async def release(self, rid: str) -> None:
        async with self.cond:
            self.in_flight.pop(rid, None)
            self.cond.notify_all()

    async def wait_idle(self) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: not self.in_flight)

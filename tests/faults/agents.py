"""Agents that misbehave on purpose, importable as `tests.faults.agents.<Name>` (also in the
subproc workers)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

GO = threading.Event()  # BlockedAgent waits for it


async def _one_call(data: dict[str, Any], kw: dict[str, Any]) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"])
    await client.chat.completions.create(model="default", messages=data["messages"], max_completion_tokens=4)
    return 1.0


class BlockedAgent:
    """One call once `GO` is set (so a test knows a step is running meanwhile)."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        while not GO.is_set():
            await asyncio.sleep(0.01)
        return await _one_call(data, kw)


class StubbornAgent:
    """Every other episode after the first (the Session's first-episode check) swallows every
    exception in its retry loop, cancellation included, and never returns. (Not GeneratorExit:
    the coroutine of an abandoned episode is closed when the interpreter exits, and one that
    swallowed that too would spin for ever in the exiting process.)"""

    def __init__(self) -> None:
        self._count = itertools.count()

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        n = next(self._count)
        if n > 0 and n % 2 == 0:
            while True:
                try:
                    await asyncio.sleep(0.05)
                except (Exception, asyncio.CancelledError):  # the point: cancellation swallowed too
                    pass
        return await _one_call(data, kw)


class QuickSyncAgent:
    """A subproc agent that answers in 0.3 s (plus one short call)."""

    def run(self, data: dict[str, Any]) -> float:
        from openai import OpenAI

        time.sleep(0.3)
        OpenAI().chat.completions.create(model="default", messages=data["messages"], max_completion_tokens=2)
        return 1.0

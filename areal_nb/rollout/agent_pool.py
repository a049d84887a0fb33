"""`AgentProcessPool`: where `OpenAIProxyWorkflow`'s `subproc` mode runs its agents.

Each episode runs `asyncio.run(agent.run(data))` in a spawn-context process pool with the
session's env vars set, so sync SDK code works. The workers do not run the main program again
(`areal_nb.api.spawn`); the agent and the row travel to the worker by value (cloudpickle,
`areal_nb.api.by_value`), the agent once per episode in its current state.

The pool's workers all start before the first episode's clock runs (`agent_timeout` measures the
agent, not a process start), and at most one episode per worker is handed to the pool, so an
episode's clock runs from when a worker takes it, not while it waits in the queue. A worker stuck
in agent code past its timeout (or an episode cancelled) kills the pool; the next episode gets a
new one.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from areal_nb.api.by_value import dumps_by_value, loads_by_value
from areal_nb.api.spawn import spawn_context, spawn_pool, why_spawn_fails
from areal_nb.errors import EpisodeRejected

# How long a pool's worker processes may take to start (off the agent_timeout clock)
_WORKER_START_TIMEOUT_S = 300.0


def _worker_started(barrier: Any) -> None:
    """Pool initializer: no worker takes a job before every worker of the pool is up, so the
    warm-up (`AgentProcessPool._started`) ends when all of them are and no episode's clock runs during a start-up.
    The SDKs subproc agents call (their env vars are set per episode) are imported here, off the clock."""
    for sdk in ("openai", "anthropic"):
        try:
            importlib.import_module(sdk)
        except ImportError:
            pass
    barrier.wait(_WORKER_START_TIMEOUT_S)


def _worker_ready() -> int:
    return os.getpid()


def run_agent_in_subprocess(agent_payload: bytes, data_payload: bytes, env: dict[str, str]) -> Any:
    """Pool worker entry: set the session's env, run a fresh copy of the agent, restore the env.

    Workers are reused across episodes, so the previous episode's key must not linger.
    """
    agent = loads_by_value(agent_payload)
    data = loads_by_value(data_payload)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = agent.run(data)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _await(awaitable: Any) -> Any:
    return await awaitable


class AgentProcessPool:
    """`max_workers` spawn-context processes that run agents, started at the first episode."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self.pool: ProcessPoolExecutor | None = None  # None until the first episode, and once killed
        self._ready: asyncio.Future | None = None  # the pool's workers all started
        self._slots: asyncio.Semaphore | None = None  # one per worker (on the loop that runs episodes)
        self._slots_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, agent: Any, data: dict[str, Any], env: dict[str, str], timeout: float | None) -> Any:
        """`agent.run(data)` in a worker with `env` set; EpisodeRejected for a timeout or a dead worker."""
        pool = await self._started()
        payload = dumps_by_value(agent, "agent")  # per episode: the agent's current state
        data_payload = dumps_by_value(data, "the episode's row")
        # at most one episode per worker is handed to the pool: the clock runs from when a worker
        # takes the episode, not while it waits in the pool's queue behind others
        async with self._worker_slots():
            return await self._run_in(pool, payload, data_payload, env, timeout)

    def _process_pool(self) -> ProcessPoolExecutor:
        if self.pool is None:
            barrier = spawn_context().Barrier(self.max_workers)
            self.pool = spawn_pool(self.max_workers, _worker_started, (barrier,))
            self._ready = None
        return self.pool

    async def _started(self) -> ProcessPoolExecutor:
        """The pool with all its workers started (agent_timeout measures the agent, not this);
        EpisodeRejected with the workers' own traceback when they cannot start."""
        pool = self._process_pool()
        ready = self._ready
        if ready is not None and ready.get_loop() is not asyncio.get_running_loop():
            # started from another event loop (asyncio.run per call): its future cannot be awaited
            # here; a start that finished there stands, anything else starts over on this loop
            if ready.done() and not ready.cancelled() and ready.exception() is None:
                return pool
            self._ready = None
        if self._ready is None:
            # one job per worker: a spawn pool starts a process per job it has no idle worker for,
            # and the initializer's barrier holds every job until all the workers are up
            jobs = [asyncio.wrap_future(pool.submit(_worker_ready)) for _ in range(self.max_workers)]
            self._ready = asyncio.gather(*jobs)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), _WORKER_START_TIMEOUT_S)
        except (BrokenProcessPool, TimeoutError) as exc:
            if self.pool is pool:
                self.kill()
            reason = await asyncio.to_thread(why_spawn_fails)
            raise EpisodeRejected(
                "subproc_crash",
                "the agent's worker processes cannot start"
                + (f":\n{reason}" if reason else f" ({type(exc).__name__}: {exc})"),
            ) from exc
        return pool

    def _worker_slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # both are set together
            self._slots, self._slots_loop = asyncio.Semaphore(self.max_workers), loop
        return self._slots

    async def _run_in(
        self,
        pool: ProcessPoolExecutor,
        payload: bytes,
        data_payload: bytes,
        env: dict[str, str],
        timeout: float | None,
    ) -> Any:
        future = asyncio.get_running_loop().run_in_executor(
            pool, run_agent_in_subprocess, payload, data_payload, env
        )
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            if self.pool is pool:
                self.kill()
            raise EpisodeRejected(
                "agent_timeout",
                f"subprocess agent did not finish within agent_timeout={timeout}s; its worker pool was killed",
            ) from exc
        except BrokenProcessPool as exc:
            if self.pool is pool:
                self.pool = None
            raise EpisodeRejected("subproc_crash", f"agent worker process died: {exc}") from exc
        except asyncio.CancelledError:
            # The worker would go on running the abandoned agent; stop it with its pool.
            if self.pool is pool:
                self.kill()
            raise

    def kill(self) -> None:
        """A worker is stuck in agent code: kill the pool's processes; the next episode gets a new pool."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for proc in processes:
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.join(timeout=5)

    def close(self) -> None:
        """Shut the pool down, its workers' current jobs finished (a later episode starts a new one)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

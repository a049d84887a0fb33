"""`AsyncRewardWrapper`: run a synchronous reward function in worker processes from asyncio.

Semantics follow AReaL's wrapper (docs/reference/areal-semantics.md, "Reward functions in worker
processes") with these deliberate differences:

- Workers are started with the `spawn` context: the notebook kernel runs threads, and `fork`
  copies their locks in whatever state they are in. (`forkserver` would leave its server
  process running after the pool is gone.) They start without running the main program again
  (`areal_nb.api.spawn`), so a script with a top-level Session works unguarded. The reward
  function and its arguments travel by value with cloudpickle (`areal_nb.api.by_value`), so
  one defined in a notebook cell or a script works; one that closes over something that cannot
  travel (a lock, a socket) is refused at construction with `NotSerializableError` naming it.
- The reward function may be `async def`: the worker runs it to completion with `asyncio.run`.
- A call that times out does not leave a hung process occupying a worker: the pool is
  replaced at once (new calls go to the fresh pool) and the old one is killed as soon as no
  other call still waits on it. The same happens when a call is cancelled (a KeyboardInterrupt
  in a notebook cell cancels the rollout): the abandoned job may still be running.
- After every attempt timed out, the wrapper raises `RewardTimeoutError` by default, so the
  episode is rejected with a logged reason; `on_timeout="zero"` gives AReaL's `return 0`.
- A reward function that crashes its worker (segfault, `os._exit`) on every attempt raises
  `RewardWorkerCrashedError`; one that raises on every attempt raises
  `RewardFunctionError` chained to the original exception.

Pools are shared by all wrappers with the same `max_workers` (ref-counted); the last
`close()` (or garbage collection, or interpreter exit) shuts the pool down and reaps its
processes.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import inspect
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from areal_nb.api.by_value import dumps_by_value, loads_by_value
from areal_nb.api.spawn import spawn_pool, why_spawn_fails
from areal_nb.errors import (  # noqa: F401 (re-exported)
    CallOrderError,
    InvalidArgumentError,
    RewardError,
    RewardFunctionError,
    RewardTimeoutError,
    RewardWorkerCrashedError,
)

logger = logging.getLogger(__name__)


def default_max_workers() -> int:
    """Half the CPUs per accelerator, at least 1 (AReaL's rule; no CUDA initialisation)."""
    try:
        devices = [n for n in os.listdir("/dev") if re.fullmatch(r"(nvidia|davinci)\d+", n)]
    except OSError:
        devices = []
    cpus = os.cpu_count() or 1
    return max((cpus // max(len(devices), 1)) // 2, 1)


def _import_module(name: str) -> None:
    importlib.import_module(name)


@functools.lru_cache(maxsize=16)
def _reward_function(payload: bytes) -> Callable[..., Any]:
    # Unpickled once per worker process: a by-value function may carry sizeable globals.
    return loads_by_value(payload)


def _call_reward(payload: bytes, arguments: bytes) -> Any:
    """Worker entry: the reward function and its arguments from their cloudpickle bytes, called
    (and awaited). (By value: a row may hold an object of a class the main program defined, which
    the worker, not running that program, could not find by name.)"""
    args, kwargs = loads_by_value(arguments)
    result = _reward_function(payload)(*args, **kwargs)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class _Pool:
    """One ProcessPoolExecutor plus the number of calls still waiting on it."""

    def __init__(self, max_workers: int) -> None:
        self.executor = spawn_pool(max_workers)
        self.waiting = 0
        self.retired = False
        self.warm: dict[str, Any] = {}  # module name -> concurrent future of its import in a worker

    def warm_up(self, module: str):
        """Start the workers and import the reward function's module there, once per pool.

        Spawning interpreters and importing math-verify takes seconds on a busy machine; that
        start-up must not count against the per-call timeout.
        """
        if module not in self.warm:
            self.warm[module] = self.executor.submit(_import_module, module)
        return self.warm[module]

    def kill(self) -> None:
        # Private attribute, stable since 3.8: the executor has no public way to stop a worker
        # that is stuck inside a task (3.14 adds `kill_workers`).
        processes = list((getattr(self.executor, "_processes", None) or {}).values())
        for proc in processes:
            if proc.is_alive():
                proc.kill()
        self.executor.shutdown(wait=True, cancel_futures=True)
        for proc in processes:
            proc.join(timeout=5)


class _SharedPool:
    """The pool currently used by all wrappers with one `max_workers` value."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self.refs = 0
        self.current: _Pool | None = None
        self.lock = threading.Lock()

    def acquire(self) -> _Pool:
        with self.lock:
            if self.current is None:
                # Created lazily: a wrapper that is never called starts no process.
                self.current = _Pool(self.max_workers)
            self.current.waiting += 1
            return self.current

    def release(self, pool: _Pool) -> None:
        with self.lock:
            pool.waiting -= 1
            kill = pool.retired and pool.waiting == 0
        if kill:
            pool.kill()

    def retire(self, pool: _Pool) -> None:
        """Stop sending work to `pool` (hung or broken); it dies when its last caller leaves."""
        with self.lock:
            if not pool.retired:
                pool.retired = True
                if self.current is pool:
                    self.current = None

    def shutdown(self) -> None:
        with self.lock:
            pool, self.current = self.current, None
        if pool is not None:
            pool.retired = True
            pool.kill()


_registry_lock = threading.Lock()
_shared_pools: dict[int, _SharedPool] = {}


def _ref_shared_pool(max_workers: int) -> _SharedPool:
    with _registry_lock:
        shared = _shared_pools.setdefault(max_workers, _SharedPool(max_workers))
        shared.refs += 1
        return shared


def _unref_shared_pool(shared: _SharedPool) -> None:
    with _registry_lock:
        shared.refs -= 1
        last = shared.refs == 0
        if last and _shared_pools.get(shared.max_workers) is shared:
            del _shared_pools[shared.max_workers]
    if last:
        shared.shutdown()


@atexit.register
def _shutdown_all_pools() -> None:
    with _registry_lock:
        pools = list(_shared_pools.values())
        _shared_pools.clear()
    for shared in pools:
        shared.shutdown()


class AsyncRewardWrapper:
    """`await wrapper(*args, **kwargs) -> float` runs `reward_fn(*args, **kwargs)` in a worker.

    Each call makes up to `max_retries + 1` attempts of at most `timeout_seconds` each.
    """

    def __init__(
        self,
        reward_fn: Callable[..., float],
        timeout_seconds: float = 15,
        max_workers: int | None = None,
        max_retries: int = 3,
        on_timeout: Literal["raise", "zero"] = "raise",
        startup_timeout: float = 120.0,
    ) -> None:
        if timeout_seconds <= 0:
            raise InvalidArgumentError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        if max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be >= 0, got {max_retries}")
        if on_timeout not in ("raise", "zero"):
            raise InvalidArgumentError(f"on_timeout must be 'raise' or 'zero', got {on_timeout!r}")
        self._payload = dumps_by_value(reward_fn, "reward function")
        self.reward_fn = reward_fn
        self.timeout_seconds = timeout_seconds
        self.max_workers = max_workers if max_workers is not None else default_max_workers()
        if self.max_workers < 1:
            raise InvalidArgumentError(f"max_workers must be >= 1, got {self.max_workers}")
        self.max_retries = max_retries
        self.on_timeout = on_timeout
        self.startup_timeout = startup_timeout
        self._slots: dict[int, asyncio.Semaphore] = {}  # per event loop
        self._shared: _SharedPool | None = _ref_shared_pool(self.max_workers)
        self._finalizer = weakref.finalize(self, _unref_shared_pool, self._shared)

    @property
    def _name(self) -> str:
        return getattr(self.reward_fn, "__qualname__", repr(self.reward_fn))

    async def __call__(self, *args: Any, **kwargs: Any) -> float:
        shared = self._shared
        if shared is None:
            raise CallOrderError("AsyncRewardWrapper is closed")
        loop = asyncio.get_running_loop()
        job = functools.partial(
            _call_reward, self._payload, dumps_by_value((args, kwargs), "reward arguments")
        )
        attempts = self.max_retries + 1
        last: BaseException | None = None
        # The timeout measures the reward function, not the queue: at most max_workers calls
        # are submitted at once, the others wait here without a clock running.
        slots = self._slots.setdefault(id(loop), asyncio.Semaphore(self.max_workers))
        for attempt in range(1, attempts + 1):
            await slots.acquire()
            pool = shared.acquire()
            try:
                await self._warm_up(shared, pool)
                future = loop.run_in_executor(pool.executor, job)
                return float(await asyncio.wait_for(future, self.timeout_seconds))
            except TimeoutError as exc:
                last = exc
                shared.retire(pool)  # the hung worker is killed once no one else waits on it
                logger.warning(
                    "reward %s timed out after %ss (attempt %d/%d)",
                    self._name,
                    self.timeout_seconds,
                    attempt,
                    attempts,
                )
            except asyncio.CancelledError:
                # The job may still run (or hang) in a worker; it must not keep the slot.
                shared.retire(pool)
                raise
            except BrokenProcessPool as exc:
                last = exc
                shared.retire(pool)
                logger.warning(
                    "reward %s: worker process died (attempt %d/%d): %s", self._name, attempt, attempts, exc
                )
            except RewardWorkerCrashedError:
                raise  # (its workers cannot start: retrying cannot help)
            except Exception as exc:
                last = exc
                logger.warning("reward %s raised %r (attempt %d/%d)", self._name, exc, attempt, attempts)
            finally:
                shared.release(pool)
                slots.release()

        return self._after_every_attempt_failed(last, attempts)

    async def _warm_up(self, shared: _SharedPool, pool: _Pool) -> None:
        """Start `pool`'s interpreters off the reward's clock (RewardWorkerCrashedError, with the
        reason, when they cannot start at all)."""
        # A by-value function (notebook cell, `__main__`) has no module to import there;
        # warming up this module still starts the interpreters off the clock.
        module = getattr(self.reward_fn, "__module__", None)
        if not module or module == "__main__":
            module = __name__
        try:
            await asyncio.wait_for(asyncio.wrap_future(pool.warm_up(module)), self.startup_timeout)
        except BrokenProcessPool:
            # the workers died before running anything: say why, once, instead of retrying
            reason = await asyncio.to_thread(why_spawn_fails)
            if reason is not None:
                shared.retire(pool)
                raise RewardWorkerCrashedError(
                    f"reward function {self._name}: its worker processes cannot start:\n{reason}"
                ) from None
            raise

    def _after_every_attempt_failed(self, last: BaseException | None, attempts: int) -> float:
        """0.0 when every attempt timed out and `on_timeout` says so; else the error for `last`."""
        if isinstance(last, TimeoutError):
            if self.on_timeout == "zero":
                logger.warning("reward %s timed out on all %d attempts; returning 0.0", self._name, attempts)
                return 0.0
            raise RewardTimeoutError(
                f"reward function {self._name} timed out ({self.timeout_seconds}s) on all {attempts} attempts"
            ) from last
        if isinstance(last, BrokenProcessPool):
            raise RewardWorkerCrashedError(
                f"reward function {self._name} crashed its worker process on all {attempts} attempts"
            ) from last
        raise RewardFunctionError(
            f"reward function {self._name} raised {last!r} on all {attempts} attempts"
        ) from last

    def close(self) -> None:
        """Release this wrapper's share of the pool; the last one out stops the processes."""
        if self._shared is not None:
            self._shared = None
            self._finalizer()

    def __enter__(self) -> AsyncRewardWrapper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

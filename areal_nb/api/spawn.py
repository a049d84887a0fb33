"""Worker processes started with `spawn` from any kind of main program, and why one cannot start.

A `spawn` worker first runs the parent's main program again: the preparation data it is sent
names `__main__`'s file (`init_main_from_path`) or module (`init_main_from_name`, `python -m`),
and the worker executes it as `__mp_main__`. A training script written at top level (no
`if __name__ == "__main__":`, as most are) would start a whole Session in every worker, which
multiprocessing stops with its "bootstrapping phase" error, so every worker died, on every
attempt of every episode; a program read from stdin (`<stdin>`) has no file to run at all.

areal_nb's workers need nothing from the main program: user code travels by value
(`by_value.py`: cloudpickle sends a function, a class or an agent defined in `__main__` with what
it refers to, importable ones by name), and so do the arguments that might hold a `__main__`
object. So every process of a `spawn_pool` starts with `__main__` hidden from its preparation
data (`spawn_context()`): a script works as written, as a notebook does (a kernel's `__main__`
has no file). The other ways out were weighed: `forkserver` imports `__main__` into its server
too and leaves that process running after the pool; running importable reward functions in
threads would leave no way to stop one that hangs (math-verify can). The price: a worker does
not see what the script's top level did to other modules (a registry it filled, a setting it
changed), only what the function itself refers to, as in a notebook.

`why_spawn_fails()` starts one interpreter the way `spawn` prepares its workers and returns its
traceback: what a pool that broke at start-up reports instead of "terminated abruptly".

`spawn_pool()` makes such a pool whose workers cannot hold the interpreter's exit: at exit the
standard library waits for every pool's pending jobs, so one agent or reward function stuck in a
worker of a pool nobody shut down (a Session never closed, a kernel restarted) would hang the
process for ever. The workers still alive are killed first. The other way round, a worker
ends by itself when this process dies without that hook (SIGKILL, a crash): `parent_watch.py`.
"""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from .parent_watch import watch_parent

_lock = threading.Lock()
_hidden: dict[str, Any] = {"depth": 0, "saved": None}
_ABSENT = object()

_PREPARE = (
    "import pickle, sys\n"
    "from multiprocessing import spawn\n"
    "spawn.prepare(pickle.loads(sys.stdin.buffer.read()))\n"
)


@contextmanager
def spawn_safely() -> Iterator[None]:
    """While processes start: `__main__` shows spawn no file and no module name to run again.

    (Attributes of `__main__` are hidden, not `sys.modules["__main__"]` replaced: another thread
    may be pickling a `__main__` object by name meanwhile.) Re-entrant; restored on the way out."""
    main = sys.modules.get("__main__")
    with _lock:
        if _hidden["depth"] == 0 and main is not None:
            saved = {name: main.__dict__.get(name, _ABSENT) for name in ("__file__", "__spec__")}
            main.__dict__.pop("__file__", None)
            if saved["__spec__"] is not _ABSENT:
                main.__spec__ = None
            _hidden["saved"] = saved
        _hidden["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _hidden["depth"] -= 1
            if _hidden["depth"] == 0 and _hidden["saved"] is not None:
                for name, value in _hidden["saved"].items():
                    if value is not _ABSENT:
                        setattr(main, name, value)
                _hidden["saved"] = None


class SpawnProcess(multiprocessing.context.SpawnProcess):
    """A `spawn` process that does not run the parent's main program before its target.

    (Named as the standard class: processes keep their names, `SpawnProcess-N`.)"""

    def start(self) -> None:
        with spawn_safely():
            super().start()


class _MainlessSpawnContext(multiprocessing.context.SpawnContext):
    Process = SpawnProcess  # what ProcessPoolExecutor starts its workers with


_CONTEXT = _MainlessSpawnContext()


def spawn_context() -> multiprocessing.context.SpawnContext:
    """The `spawn` context of areal_nb's worker pools (its processes start without `__main__`)."""
    return _CONTEXT


def why_spawn_fails(timeout: float = 120.0) -> str | None:
    """The traceback of an interpreter prepared as `spawn` prepares a worker, or None if it starts."""
    from multiprocessing import spawn

    with spawn_safely():
        data = spawn.get_preparation_data("areal-nb-spawn-probe")
    data.pop("authkey", None)  # (not picklable outside multiprocessing, and not needed to start)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PREPARE], input=pickle.dumps(data), capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"a worker interpreter did not start within {timeout} s"
    if done.returncode == 0:
        return None
    return (
        done.stderr.decode(errors="replace")[-4000:] or f"a worker interpreter exited with {done.returncode}"
    )


# (the pool, weakly; its process table, strongly: the table outlives a pool that was dropped
# without a shutdown, and so do its processes and the thread that waits on them)
_pools: list[tuple[weakref.ref[ProcessPoolExecutor], Mapping[int, multiprocessing.process.BaseProcess]]] = []
_pools_lock = threading.Lock()


def spawn_pool(
    max_workers: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """A `spawn` process pool whose workers start without `__main__`, are killed at interpreter
    exit if still alive, and end by themselves when this process dies (`parent_watch`)."""
    pool = ProcessPoolExecutor(
        max_workers=max_workers,
        mp_context=_CONTEXT,
        initializer=_start_worker,
        initargs=(initializer, initargs),
    )
    with _pools_lock:
        _pools[:] = [(ref, procs) for ref, procs in _pools if ref() is not None or _any_alive(procs)]
        _pools.append((weakref.ref(pool), pool._processes))  # private, stable since 3.8 (3.14: kill_workers)
    return pool


def _start_worker(initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    """Every pool worker's initializer: watch the parent first, then the pool's own initializer."""
    watch_parent()
    if initializer is not None:
        initializer(*initargs)


def _any_alive(processes: Mapping[int, multiprocessing.process.BaseProcess]) -> bool:
    return any(proc.is_alive() for proc in list(processes.values()))


def _kill_workers_at_exit() -> None:
    with _pools_lock:
        tables = [procs for _, procs in _pools]
        _pools.clear()
    for procs in tables:
        for proc in list(procs.values()):
            if proc.is_alive():
                proc.kill()


# `threading`'s exit hooks run before it joins the pools' manager threads (an `atexit` handler
# would run after: too late); hooks run last-registered first, so this one precedes
# concurrent.futures' own, registered when it was imported above.
threading._register_atexit(_kill_workers_at_exit)  # type: ignore[attr-defined]

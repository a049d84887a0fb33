"""Worker processes started with `spawn` from any kind of main program, and why one cannot start.

A spawned worker first re-imports the parent's `__main__` from its file. A program read from
stdin (`python - <<EOF`) has the file name `<stdin>`, which does not exist: every worker dies
before it runs anything, and the pool only says a process "terminated abruptly". areal_nb's
workers need nothing from `__main__` (user code travels by value, `by_value.py`), so while a
pool starts its processes `spawn_safely()` hides a `__main__` file that does not exist.

`why_spawn_fails()` starts one interpreter the way `spawn` prepares its workers and returns its
traceback: what a pool that broke at start-up reports instead of "terminated abruptly".

`spawn_pool()` makes such a pool whose workers cannot hold the interpreter's exit: at exit the
standard library waits for every pool's pending jobs, so one agent or reward function stuck in a
worker of a pool nobody shut down (a Session never closed, a kernel restarted) would hang the
process for ever. The workers still alive are killed first.
"""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_hidden = {"depth": 0, "file": None}

_PREPARE = (
    "import pickle, sys\n"
    "from multiprocessing import spawn\n"
    "spawn.prepare(pickle.loads(sys.stdin.buffer.read()))\n"
)


def _unimportable_main_file() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(getattr(main, "__spec__", None), "name", None):
        return None  # no file, or imported by module name (python -m, Jupyter): spawn manages
    return None if Path(path).is_file() else path


@contextmanager
def spawn_safely() -> Iterator[None]:
    """Around the call that starts a spawn pool's processes (its first `submit`)."""
    main = sys.modules.get("__main__")
    with _lock:
        if _hidden["depth"] == 0:
            _hidden["file"] = _unimportable_main_file()
            if _hidden["file"] is not None:
                del main.__file__
        _hidden["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _hidden["depth"] -= 1
            if _hidden["depth"] == 0 and _hidden["file"] is not None:
                main.__file__ = _hidden["file"]
                _hidden["file"] = None


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
_pools: list[tuple[weakref.ref[ProcessPoolExecutor], dict[int, multiprocessing.process.BaseProcess]]] = []
_pools_lock = threading.Lock()


def spawn_pool(
    max_workers: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """A `spawn` process pool whose workers are killed at interpreter exit if still alive."""
    pool = ProcessPoolExecutor(
        max_workers=max_workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=initializer,
        initargs=initargs,
    )
    with _pools_lock:
        _pools[:] = [(ref, procs) for ref, procs in _pools if ref() is not None or _any_alive(procs)]
        _pools.append((weakref.ref(pool), pool._processes))  # private, stable since 3.8 (3.14: kill_workers)
    return pool


def _any_alive(processes: dict[int, multiprocessing.process.BaseProcess]) -> bool:
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

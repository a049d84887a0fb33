"""Worker processes that end when the process that started them dies.

A pool's worker waits for its next job on a queue whose write end it holds itself, so it never
learns that its parent is gone. A parent that ends without running its exit hooks (killed with
SIGKILL or by the OOM killer, crashed in native code) left its workers behind for ever, each
holding its memory, and a worker busy in a hung agent or reward function would not even read the
queue. `watch_parent()`, run first in every worker of a `spawn_pool` (`areal_nb.api.spawn`),
starts a daemon thread that waits for the parent's death and then ends the worker with
`os._exit` (nothing is left to report to; a worker's own workers see it die and end too).

How the death is seen: the parent sentinel multiprocessing gives every process it starts
(`multiprocessing.parent_process().sentinel`): on POSIX the read end of a pipe whose write end
only the parent holds, on Windows the parent's process handle. It is ready the moment the parent
*process* ends, whichever of its threads started the worker. As a second sign, `os.getppid()`
changing (the worker was handed to init or a subreaper) is checked every `_POLL_S`: a child the
parent forked without `exec` would hold a copy of the pipe's write end and keep the sentinel
quiet. Linux's `prctl(PR_SET_PDEATHSIG)` is not used: it fires when the *thread* that started the
worker ends, not the process, and areal_nb's pools are started from whichever thread first
submits to them (a Session's loop thread, a notebook's thread); a reward pool shared by several
wrappers outlives the thread that started it, and its workers would be killed under its users.
It is Linux-only as well.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading

_POLL_S = 1.0  # how often the parent's pid is checked (the sentinel wakes the watch at once)
_EXIT_CODE = 70  # a worker ended because its parent died (EX_SOFTWARE: distinct from a crash's signal)

_watching = False
_lock = threading.Lock()


def watch_parent() -> None:
    """In a process started by multiprocessing: end it when its parent process dies. Once per
    process; a no-op in a process multiprocessing did not start."""
    global _watching
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    with _lock:
        if _watching:
            return
        _watching = True
    threading.Thread(
        target=_exit_when_gone,
        args=(parent.sentinel, os.getppid()),
        name="areal-nb-parent-watch",
        daemon=True,
    ).start()


def _exit_when_gone(sentinel: int, parent_pid: int) -> None:
    while not multiprocessing.connection.wait([sentinel], timeout=_POLL_S):
        if os.getppid() != parent_pid:
            break
    os._exit(_EXIT_CODE)

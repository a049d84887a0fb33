"""What the fault tests share: a small Session config and a check that nothing outlived a call."""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
from pathlib import Path

import pytest

from areal_nb.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
SMALL = dict(rollout__batch_size=2, rollout__group_size=2, logging__progress=False, rollout__prefetch=False)
# process-wide daemons of libraries, not the Session's (tqdm's progress-bar monitor starts with
# the first bar transformers draws and lives as long as the process)
LIBRARY_THREADS = {"tqdm_monitor"}


def small_config(**kw):
    overrides = {**SMALL, **kw}
    return load_config(CONFIG, [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])


def port_is_free(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        try:
            sock.bind((host, int(port)))
        except OSError:
            return False
    return True


class Leftovers:
    """Threads and child processes started since `__init__` that are still alive."""

    def __init__(self) -> None:
        self.threads = {t.ident for t in threading.enumerate()}
        self.children = {p.pid for p in multiprocessing.active_children()}

    def check(self, timeout: float = 10.0) -> tuple[list[str], list[int]]:
        deadline = time.monotonic() + timeout
        while True:
            threads = [t.name for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()
                       and t.name not in LIBRARY_THREADS]
            children = [p.pid for p in multiprocessing.active_children() if p.pid not in self.children]
            if (not threads and not children) or time.monotonic() > deadline:
                return threads, children
            time.sleep(0.2)


@pytest.fixture
def leftovers():
    return Leftovers()

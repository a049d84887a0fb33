"""Shared fixtures and the fast/slow split.

The built-in tiny model is built once per machine and cached on disk.

`make test-fast` runs `-m "not slow and not server and not browser"`: unit tests only. A test
that starts a `ProxyServer` (real uvicorn on loopback) must be marked `server` (or `slow`);
`_servers_only_in_marked_tests` fails an unmarked one with a message saying so, so the fast set
stays fast as tests are added. See `[tool.pytest.ini_options] markers` in pyproject.toml.
"""

from __future__ import annotations

import gc
import os

# Two cores: keep torch from oversubscribing when tests and servers run side by side.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

# Markers under which a test may start servers (`make test-fast` deselects them all).
SERVER_MARKERS = ("server", "slow", "browser")
_current_test: dict[str, pytest.Item | None] = {"item": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the item's fixtures: a module-scoped server fixture is attributed to this test.
    _current_test["item"] = item


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """Collecting imports torch, transformers and every test module: millions of long-lived objects
    that each full garbage collection would walk again (a third of collection's CPU, and seconds
    more during the tests). What each collector (a module's import, mostly) leaves alive is frozen
    (`gc.freeze`: kept, never walked again), so full collections walk only what came after."""
    try:
        return (yield)
    finally:
        gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _servers_only_in_marked_tests():
    """Refuse `ProxyServer.start()`/`astart()` in a test not marked server/slow/browser."""
    from areal_nb.proxy.server import ProxyServer

    def guarded(original):
        def check(*args, **kwargs):
            item = _current_test["item"]
            if item is not None and not any(item.get_closest_marker(m) for m in SERVER_MARKERS):
                raise RuntimeError(
                    f"{item.nodeid} starts a ProxyServer but is not marked: add "
                    "@pytest.mark.server (or pytestmark = pytest.mark.server) so `make test-fast` "
                    "keeps to unit tests"
                )
            return original(*args, **kwargs)

        return check

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProxyServer, "start", guarded(ProxyServer.start))
        mp.setattr(ProxyServer, "astart", guarded(ProxyServer.astart))
        yield


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from areal_nb.models import load_tokenizer

    return load_tokenizer("tiny-math")


@pytest.fixture(scope="session")
def tiny_model_path():
    from areal_nb.models import resolve_model_path

    return resolve_model_path("tiny-math")


@pytest.fixture(scope="session")
def smollm2():
    """(GGUF file, converted Hugging Face folder) of SmolLM2-135M-Instruct (tests/models/smollm2.py)."""
    from tests.models.smollm2 import INSTALL, build_smollm2_folder, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.fail(f"the real-model tests need SmolLM2's GGUF file: {INSTALL}")
    return gguf, build_smollm2_folder(gguf)


@pytest.fixture(scope="session")
def local_engine(tiny_model_path, tiny_tokenizer):
    """One real `LocalEngine` on tiny-math (seed 0) shared by every test that only generates.

    Tests that change the engine (weights, version, pause, close) build their own instead.
    """
    from areal_nb.engine import LocalEngine

    engine = LocalEngine(tiny_model_path, tiny_tokenizer, device="cpu", seed=0)
    yield engine
    engine.close()


def pytest_terminal_summary(terminalreporter) -> None:
    """Say loudly when the browser or the Slurm tests did not run, and how to make them run (not
    only under -rs). `slurm` is the folder tests/slurm/, a keyword of every test in it."""
    for report in terminalreporter.stats.get("skipped", []):
        for kind in ("browser", "slurm"):
            # a module skipped as a whole is a CollectReport, which has no keywords
            if kind in getattr(report, "keywords", ()) and isinstance(report.longrepr, tuple):
                reason = report.longrepr[2].removeprefix("Skipped: ")
                terminalreporter.write_sep("!", f"{kind} test skipped", yellow=True)
                terminalreporter.write_line(f"{report.nodeid}: {reason}", yellow=True)


def pytest_unconfigure(config) -> None:
    """Name what would keep the interpreter from exiting after the last test: a non-daemon thread
    (an executor's worker, a server) or a child process is joined at exit, and a leaked one hangs
    the run after its summary. Such a leak is printed, and if the process is still alive five minutes
    later every thread's stack is dumped and it exits with status 1 instead of hanging."""
    import faulthandler
    import multiprocessing
    import sys
    import threading

    threads = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    children = multiprocessing.active_children()
    if threads or children:
        print("\nstill running after the last test (joined at exit):", file=sys.stderr)
        for thread in threads:
            print(
                f"  thread {thread.name!r} ({type(thread).__module__}.{type(thread).__name__})",
                file=sys.stderr,
            )
        for child in children:
            print(f"  process {child.name!r} pid {child.pid}", file=sys.stderr)
    faulthandler.dump_traceback_later(300, exit=True)

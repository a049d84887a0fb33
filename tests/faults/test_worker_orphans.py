"""No process a Session starts outlives it, nor the program that made it.

A program below starts a Session whose agent runs in worker processes (`agent.mode: subproc`),
with reward functions in worker processes of their own (in the main program and inside an agent
worker) and an MCP server. Killed with SIGKILL, it runs no exit hook: every worker must notice
that its parent died and end by itself (`areal_nb.api.parent_watch`), the busy ones included
(an agent and reward functions stuck in user code), and the MCP server ends when its stdin
closes. Closed normally, the Session must leave no worker behind either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GONE_WITHIN_S = 60  # a bound for a loaded 2-core machine; the workers' watch wakes at once

PROGRAM = textwrap.dedent("""
    import asyncio, json, sys, threading, time
    from pathlib import Path
    import psutil
    from areal_nb import Session
    from areal_nb.agents.mcp_agent import SharedMCPServers, calculator_servers
    from areal_nb.config import load_config
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper

    CONFIG = sys.argv[1]
    SMALL = ["rollout.batch_size=2", "rollout.group_size=2", "rollout.prefetch=false",
             "logging.progress=false", "agent.mode=subproc", "agent.subproc_max_workers=1",
             "agent.agent_timeout=3600"]

    def stuck(marker):  # a reward function that never returns
        Path(marker).write_text("inside")
        time.sleep(3600)

    class OneCallAgent:
        def run(self, data):
            from openai import OpenAI

            OpenAI(max_retries=0).chat.completions.create(
                model="default", messages=data["messages"], max_completion_tokens=4
            )
            return 1.0

    class StuckAgent:
        '''One call through the proxy, then a reward function (in its own worker) that never returns.'''

        def __init__(self, marker):
            self.marker = marker

        def run(self, data):
            from openai import OpenAI

            OpenAI(max_retries=0).chat.completions.create(
                model="default", messages=data["messages"], max_completion_tokens=4
            )
            reward = AsyncRewardWrapper(stuck, timeout_seconds=3600, max_workers=1, max_retries=0)
            return asyncio.run(reward(self.marker))

    def descendants():
        out = []
        for proc in psutil.Process().children(recursive=True):
            try:
                out.append({"pid": proc.pid, "ppid": proc.ppid(), "cmdline": " ".join(proc.cmdline())})
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_for(path):
        while not Path(path).exists():
            time.sleep(0.2)

    if __name__ == "__main__":
        mode, workdir = sys.argv[2], Path(sys.argv[3])
        if mode == "close":
            with Session(load_config(CONFIG, SMALL), agent__workflow=OneCallAgent()) as session:
                session.rollout()
                print(json.dumps({"during": descendants()}), flush=True)
            print(json.dumps({"after": descendants()}), flush=True)
        else:  # "kill": everything busy, then this process is killed with SIGKILL
            session = Session(load_config(CONFIG, SMALL), agent__workflow=StuckAgent(str(workdir / "agent")))
            session.start()
            threading.Thread(target=session.rollout, daemon=True).start()
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()
            reward = AsyncRewardWrapper(stuck, timeout_seconds=3600, max_workers=1, max_retries=0)
            asyncio.run_coroutine_threadsafe(reward(str(workdir / "main")), loop)
            asyncio.run_coroutine_threadsafe(SharedMCPServers(calculator_servers).get(), loop).result(300)
            wait_for(workdir / "agent")
            wait_for(workdir / "main")
            print(json.dumps({"busy": descendants()}), flush=True)
            time.sleep(3600)
""")

CONFIG = ROOT / "configs" / "multi_turn_math.yaml"


def start(tmp_path: Path, mode: str) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(PROGRAM)
    return subprocess.Popen(
        [sys.executable, "job.py", str(CONFIG), mode, str(tmp_path)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def report(proc: subprocess.Popen, key: str) -> list[dict]:
    """The list the program printed under `key` (it prints one JSON object per line)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            found = json.loads(line)
            if key in found:
                return found[key]
    proc.wait(timeout=60)
    raise AssertionError(
        f"the program ended (code {proc.returncode}) without its {key!r} report:\n"
        + (proc.stderr.read() if proc.stderr else "")[-4000:]
    )


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until_gone(pids: set[int], seconds: float) -> set[int]:
    """The pids still alive after `seconds` (empty as soon as none is)."""
    deadline = time.monotonic() + seconds
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def is_worker(proc: dict) -> bool:
    return "--multiprocessing-fork" in proc["cmdline"]


def kill_all(pids: set[int]) -> None:
    """(A failed test must not leave its orphans running on the machine.)"""
    for pid in alive(pids):
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_killing_the_program_with_sigkill_leaves_no_process_behind(tmp_path):
    proc = start(tmp_path, "kill")
    pids: set[int] = set()
    try:
        busy = report(proc, "busy")
        workers = [p for p in busy if is_worker(p)]
        # agent workers (children) with a reward worker inside one of them (a grandchild), the
        # main program's reward worker, the MCP server and multiprocessing's resource tracker
        assert any(p["ppid"] == proc.pid for p in workers)
        assert any(p["ppid"] in {w["pid"] for w in workers} for p in workers)
        assert any("calculator_mcp_server" in p["cmdline"] for p in busy)
        pids = {p["pid"] for p in busy}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = wait_until_gone(pids, GONE_WITHIN_S)
        assert not left, [p for p in busy if p["pid"] in left]
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(pids)


def test_closing_the_session_leaves_no_worker(tmp_path):
    proc = start(tmp_path, "close")
    try:
        during = report(proc, "during")
        after = report(proc, "after")
        assert any(is_worker(p) for p in during)  # the agent workers were there
        # only multiprocessing's resource tracker stays (one per program, until it exits)
        assert [p for p in after if "resource_tracker" not in p["cmdline"]] == []
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-4000:] if proc.stderr else ""
        assert not wait_until_gone({p["pid"] for p in during}, GONE_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_pool_started_from_a_thread_that_ends_keeps_its_workers():
    # the watch is on the parent process, not on the thread that started the worker (as Linux's
    # PR_SET_PDEATHSIG would be): a pool is started by whichever thread submits first
    import threading

    from areal_nb.api.spawn import spawn_pool

    pool = spawn_pool(1)
    try:
        first: list[int] = []
        starter = threading.Thread(target=lambda: first.append(pool.submit(os.getpid).result(300)))
        starter.start()
        starter.join()
        time.sleep(2)  # (the watch would have fired by now)
        assert pool.submit(os.getpid).result(60) == first[0]
    finally:
        pool.shutdown()

"""Server child processes: health wait, log streaming, death during start-up, and no orphans after
stop or interpreter exit (checked by PID). The launch path is the one the Session uses for
`engine.type: sglang`, with the command swapped for `areal-nb engine-server`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from areal_nb.engine.launcher import (
    ServerLaunchError,
    ServerProcess,
    engine_server_command,
    free_port,
    sglang_command,
)

# A "server" that ignores SIGTERM and has a child of its own, like sglang's scheduler processes.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print(f"child {child.pid}", flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_for_line(lines: list[str], prefix: str, proc: ServerProcess) -> str:
    for _ in range(600):
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return found[0]
        assert proc.alive, proc.log_tail()
        time.sleep(0.05)
    raise AssertionError(f"no line starting with {prefix!r}: {proc.log_tail()}")


@pytest.mark.slow
def test_engine_server_launch_health_log_and_stop_leaves_no_process(tmp_path):
    port = free_port()
    lines: list[str] = []
    proc = ServerProcess(
        engine_server_command("tiny-math", port=port),
        f"http://127.0.0.1:{port}",
        log_path=tmp_path / "server.log",
        on_log=lines.append,
    )
    proc.start()
    proc.wait_ready(timeout=300)
    assert httpx.get(f"{proc.url}/model_info").json()["weight_version"] == "0"
    assert any("listening on" in line for line in lines)  # the callback a log widget attaches to
    pid = proc.pid
    assert os.getpgid(pid) == pid  # its own process group: a notebook Ctrl-C does not reach it
    assert proc.stop() == 0  # SIGTERM: the server shuts down cleanly
    assert not alive(pid)
    assert "listening on" in (tmp_path / "server.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_a_server_that_dies_during_start_up_is_reported_with_its_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('cannot load model xyz', flush=True); sys.exit(3)"]
    proc = ServerProcess(cmd, f"http://127.0.0.1:{free_port()}", log_path=tmp_path / "dead.log")
    proc.start()
    with pytest.raises(ServerLaunchError, match="exited with code 3") as info:
        proc.wait_ready(timeout=60)
    assert "cannot load model xyz" in str(info.value)
    proc.stop()


def test_stop_kills_the_whole_group_when_sigterm_is_ignored():
    lines: list[str] = []
    proc = ServerProcess([sys.executable, "-c", STUBBORN], "http://127.0.0.1:9", on_log=lines.append).start()
    child = int(wait_for_line(lines, "child ", proc).split()[1])
    leader = proc.pid
    assert alive(leader) and alive(child)
    proc.stop(grace=0.5)
    assert not alive(leader)
    # the SIGKILL to the group is sent; the grandchild dies when the kernel next schedules it
    for _ in range(200):  # a hang guard, not a timing
        if not alive(child):
            break
        time.sleep(0.05)
    assert not alive(child)


@pytest.mark.server  # a Python program in a subprocess
def test_interpreter_exit_stops_servers_it_started(tmp_path):
    script = tmp_path / "leaves_a_server.py"
    script.write_text(
        textwrap.dedent(
            f"""
        import sys, time
        from areal_nb.engine.launcher import ServerProcess
        lines = []
        proc = ServerProcess([sys.executable, "-c", {STUBBORN!r}], "http://127.0.0.1:9", on_log=lines.append).start()
        while not any(l.startswith("child ") for l in lines):
            time.sleep(0.05)
        print(proc.pid, lines[0].split()[1], flush=True)
        # exits without stop(): the atexit hook must clean up
        """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    assert out.returncode == 0, out.stderr
    leader, child = (int(x) for x in out.stdout.split())
    assert not alive(leader) and not alive(child)


def test_sglang_command_uses_the_contract_flags():
    cmd = sglang_command(
        "/models/m",
        host="0.0.0.0",
        port=31000,
        tp_size=2,
        dp_size=1,
        mem_fraction_static=0.6,
        api_key="k",
        python="python",
    )
    assert cmd == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
        "--tp-size",
        "2",
        "--dp-size",
        "1",
        "--weight-version",
        "0",
        "--mem-fraction-static",
        "0.6",
        "--api-key",
        "k",
    ]


def test_a_server_gets_sigterm_when_its_parent_is_killed(tmp_path):
    """The kernel died without atexit (SIGKILL): PR_SET_PDEATHSIG still stops the server."""
    script = tmp_path / "killed_parent.py"
    script.write_text(
        textwrap.dedent(
            """
        import sys, time
        from areal_nb.engine.launcher import ServerProcess
        cmd = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
        lines = []
        proc = ServerProcess(cmd, "http://127.0.0.1:9", on_log=lines.append).start()
        while not lines:
            time.sleep(0.05)
        print(proc.pid, flush=True)
        time.sleep(600)
        """
        )
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    server = int(parent.stdout.readline())
    assert alive(server)
    parent.kill()
    parent.wait()
    for _ in range(200):  # the kernel delivers SIGTERM at once; allow the child a moment to exit
        if not alive(server):
            break
        time.sleep(0.05)
    assert not alive(server)


@pytest.mark.slow
def test_launch_remote_engine_with_engine_servers_serves_and_close_leaves_no_process(tmp_path):
    """The Session's `engine.type: sglang` path with the command swapped for `areal-nb engine-server`,
    serving in `model.dtype` as the Session asks."""
    from areal_nb.api import GenerationConfig, ModelRequest
    from areal_nb.engine.remote_launch import launch_remote_engine

    lines: list[tuple[int, str]] = []
    engine = launch_remote_engine(
        "tiny-math",
        server="engine-server",
        n_servers=2,
        api_key="k",
        weights_dir=tmp_path / "weights",
        log_dir=tmp_path / "logs",
        on_log=lambda i, line: lines.append((i, line)),
        dtype="bfloat16",
    )
    pids = [p.pid for p in engine.owned_processes]
    try:
        request = ModelRequest([5, 6, 7], GenerationConfig(max_new_tokens=4, ignore_eos=True))
        response = asyncio.run(engine.agenerate(request))
        assert response.output_len == 4
        assert {i for i, line in lines if "listening on" in line and "bfloat16" in line} == {0, 1}
        assert all(alive(pid) for pid in pids)
        # the two servers share this machine's cores: half of them each
        share = str(max(1, (os.cpu_count() or 1) // 2))
        assert all(p.command[p.command.index("--torch-threads") + 1] == share for p in engine.owned_processes)
    finally:
        engine.close()
    assert not any(alive(pid) for pid in pids)
    assert all("listening on" in (tmp_path / "logs" / f"server-{i}.log").read_text() for i in (0, 1))


def test_launch_remote_engine_stops_every_server_when_one_never_gets_healthy():
    from areal_nb.engine.remote_launch import launch_remote_engine

    pids: list[int] = []
    never_healthy = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
    with pytest.raises(ServerLaunchError, match="not healthy"):
        launch_remote_engine(
            "m",
            server=never_healthy,
            n_servers=2,
            ready_timeout=3.0,
            on_log=lambda i, line: pids.append(int(line)),
        )
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)

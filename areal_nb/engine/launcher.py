"""Engine servers as child processes: start, wait until healthy, stream the log, stop.

`ServerProcess(command, url)` starts any server command (`sglang_command(...)` builds
`python -m sglang.launch_server ...`; `engine_server_command(...)` builds `areal-nb engine-server ...`)
in its own process group (`start_new_session=True`): a Ctrl-C in the notebook does not reach it,
and `stop()` can signal the server together with the scheduler/detokenizer children SGLang spawns.
`wait_ready()` polls `GET /health` until 200 while checking the process is still alive; if it dies
the error carries its exit code and the tail of its log. Every line of output goes to `log_path`
and to the `on_log` callbacks (a notebook widget can attach with `add_log_callback`).
The server's environment is ours without torchrun's variables (`server_environment`): a server
started from a torchrun rank starts its own process group, not the trainer's.
`stop()` sends SIGTERM to the group, then SIGKILL after `grace` seconds; servers still running
when the interpreter exits are stopped by an `atexit` hook. On Linux the server also gets SIGTERM
when its parent dies without running `atexit` (a kernel killed by a signal): the command runs behind
a small shim that sets `PR_SET_PDEATHSIG` and then `exec`s it. Linux ties that signal to the
*thread* that started the child, so start servers from a thread that lives as long as they should
(the notebook's main thread, the Session's loop thread).
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from areal_nb.errors import (
    CallOrderError,
    ServerLaunchError,  # noqa: F401 (re-exported)
)
from areal_nb.serving.health import answers_health

LogCallback = Callable[[str], None]

_RUNNING: set[ServerProcess] = set()  # started and not yet stopped: the atexit hook stops these


# Runs as `python -c SHIM cmd...`: asks the kernel for SIGTERM when the parent dies, then becomes cmd.
_DEATH_SIGNAL_SHIM = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "  # 1 = PR_SET_PDEATHSIG
    "os.getppid() == 1 and sys.exit(1); "  # the parent already died before prctl took effect
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


# What torchrun (torch.distributed.run and its elastic agent) puts into each worker's environment:
# the rendezvous (MASTER_ADDR/PORT), the worker's place in the group (RANK, LOCAL_RANK, WORLD_SIZE,
# GROUP_*, ROLE_*), the agent's own settings (TORCHELASTIC_*: run id, restart count, error file, and
# TORCHELASTIC_USE_AGENT_STORE, which makes torch.distributed open a client-only store and wait for
# an agent that only exists for the trainer) and TORCH_NCCL_ASYNC_ERROR_HANDLING. A server started
# from a torchrun rank is not a member of the trainer's group: SGLang initialises its own
# process group from these variables and would hang or join the wrong one. OMP_NUM_THREADS stays:
# torchrun only sets it when the user did not, and a user's value is a user's choice.
TORCHRUN_VARIABLES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)
TORCHRUN_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


def server_environment(
    environ: dict[str, str] | os._Environ, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """`environ` without torchrun's and torch.distributed's variables, then `extra` (kept as given)."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in TORCHRUN_VARIABLES and not k.startswith(TORCHRUN_PREFIXES)
    }
    return {**env, **(extra or {})}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def sglang_command(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp_size: int = 1,
    dp_size: int = 1,
    mem_fraction_static: float | None = None,
    api_key: str | None = None,
    weight_version: int = 0,
    max_running_requests: int | None = None,
    dtype: str | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """`python -m sglang.launch_server ...`; `max_running_requests`: the most requests the server
    decodes at once (`engine.max_batch_size`; None: SGLang's own choice from its memory); `dtype`:
    the dtype it serves the model in (`model.dtype`; None: SGLang's "auto").

    The flags: docs/reference/sglang-api.md, "Launching and stopping".
    """
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp_size),
        "--dp-size",
        str(dp_size),
        "--weight-version",
        str(weight_version),
    ]
    if mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if max_running_requests is not None:
        cmd += ["--max-running-requests", str(int(max_running_requests))]
    if dtype is not None:
        cmd += ["--dtype", dtype]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + list(extra_args)


# Adapters a LoRA run's servers hold at once: the version being served and the next one, loaded
# while generation is paused before the previous is unloaded (SGLang sizes its adapter memory pool
# by this; a batch never mixes them, since the pause re-sends every request under the new one).
LORA_ADAPTERS_PER_BATCH = 2


def lora_server_args(
    rank: int, target_modules: str | Sequence[str], adapters_per_batch: int = LORA_ADAPTERS_PER_BATCH
) -> list[str]:
    """SGLang's LoRA flags for a policy trained with `actor.lora` (rank `rank`, peft's
    `target_modules`: module names or "all-linear"); `areal-nb engine-server` takes the same.
    `adapters_per_batch`: with one adapter per agent, two per agent (each agent's current and
    next version)."""
    if isinstance(target_modules, str):
        # "all-linear", or a peft regex over module paths, which names no modules before loading
        targets = ["all"]
    else:  # peft matches name suffixes (`self_attn.q_proj`); SGLang takes the module names
        targets = list(dict.fromkeys(name.split(".")[-1] for name in target_modules))
    return [
        "--enable-lora",
        "--max-lora-rank",
        str(int(rank)),
        "--lora-target-modules",
        *targets,
        "--max-loras-per-batch",
        str(int(adapters_per_batch)),
    ]


def engine_server_command(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    api_key: str | None = None,
    weights_dir: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """`areal-nb engine-server ...` (run as `python -m areal_nb.cli`, so no console script is needed)."""
    cmd = [
        python,
        "-m",
        "areal_nb.cli",
        "engine-server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
    ]
    if api_key:
        cmd += ["--api-key", api_key]
    if weights_dir is not None:
        cmd += ["--weights-dir", str(weights_dir)]
    return cmd + list(extra_args)


class ServerProcess:
    """One server child process; see the module docstring."""

    def __init__(
        self,
        command: Sequence[str],
        url: str,
        *,
        log_path: str | os.PathLike | None = None,
        on_log: LogCallback | None = None,
        env: dict[str, str] | None = None,
        tail_lines: int = 200,
        die_with_parent: bool = True,
    ) -> None:
        self.command = [str(c) for c in command]
        self.url = url.rstrip("/")
        self.log_path = Path(log_path) if log_path is not None else None
        self.env = env
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self._callbacks: list[LogCallback] = [on_log] if on_log is not None else []
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------------ info

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._tail)[-lines:])

    def add_log_callback(self, callback: LogCallback) -> None:
        self._callbacks.append(callback)

    def __repr__(self) -> str:
        state = "running" if self.alive else ("stopped" if self._proc else "not started")
        return f"ServerProcess({self.url}, pid={self.pid}, {state})"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ServerProcess:
        if self._proc is not None:
            raise CallOrderError(f"{self!r} was already started")
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_environment(os.environ, self.env)
        argv = (
            [sys.executable, "-c", _DEATH_SIGNAL_SHIM, *self.command]
            if self.die_with_parent
            else self.command
        )
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        _RUNNING.add(self)
        self._reader = threading.Thread(
            target=self._pump_log, name=f"server-log-{self._proc.pid}", daemon=True
        )
        self._reader.start()
        return self

    def wait_ready(
        self, timeout: float = 600.0, interval: float = 0.25, headers: dict[str, str] | None = None
    ) -> None:
        """Block until `GET /health` answers 200; raise ServerLaunchError if the process dies first."""
        if self._proc is None:
            raise CallOrderError("call start() first")
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=httpx.Timeout(5.0), headers=headers) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    if self._reader is not None:
                        self._reader.join(5)
                    raise ServerLaunchError(
                        f"server {self.url} exited with code {code} during start-up "
                        f"(command: {' '.join(self.command)}); last log lines:\n{self.log_tail()}"
                    )
                if answers_health(client.get, self.url):
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerLaunchError(
                        f"server {self.url} was not healthy within {timeout} s; last log lines:\n{self.log_tail()}"
                    )
                time.sleep(interval)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `grace` s; returns the exit code. Idempotent."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: the child leads its own group
        if proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while children it spawned still run: always sweep the group
        _signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        if self._reader is not None:
            self._reader.join(5)
        _RUNNING.discard(self)
        return proc.poll()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ log

    def _pump_log(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        log = open(self.log_path, "a", buffering=1, encoding="utf-8") if self.log_path else None  # noqa: SIM115
        try:
            for raw in self._proc.stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                self._tail.append(line)
                if log is not None:
                    log.write(line + "\n")
                for callback in list(self._callbacks):
                    try:
                        callback(line)
                    except Exception:  # a broken widget must not stop the log
                        pass
        finally:
            if log is not None:
                log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_all_servers() -> None:
    for server in list(_RUNNING):
        server.stop(grace=5.0)

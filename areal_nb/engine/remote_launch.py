"""`launch_remote_engine(...)`: start N engine servers as child processes and return one
`SGLangEngine` over them that stops them on `close()`.

What `engine.type: sglang` means for the Session: `server="sglang"` runs
`python -m sglang.launch_server`; `server="engine-server"` runs `areal-nb engine-server` (CPU
machines, and the tests, which exercise this exact path); a list of strings is any other command,
with `{model}`, `{host}`, `{port}`, `{api_key}`, `{weights_dir}` filled in per server.
All servers start at once; if one fails, the ones already started are stopped before the error
(with that server's log tail) is raised. With `lora` (the policy's LoRA settings: `r`,
`target_modules`) the SGLang and engine-server commands get the LoRA flags
(`launcher.lora_server_args`) and the engine takes adapter pushes; a command list gets none.
`lora_adapters`: how many adapters a batch may hold (`--max-loras-per-batch`; two per agent when
each agent trains its own).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_nb.errors import InvalidArgumentError

from .launcher import (
    LORA_ADAPTERS_PER_BATCH,
    ServerProcess,
    engine_server_command,
    free_port,
    lora_server_args,
    sglang_command,
)
from .sglang_client import SGLangEngine


def launch_remote_engine(
    model_path: str,
    *,
    server: str | Sequence[str] = "sglang",
    n_servers: int = 1,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    tp_size: int = 1,
    dp_size: int = 1,
    mem_fraction_static: float | None = None,
    api_key: str | None = None,
    weights_dir: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    log_dir: str | os.PathLike | None = None,
    on_log: Callable[[int, str], None] | None = None,
    ready_timeout: float = 600.0,
    tokenizer: Any = None,
    max_context: int | None = None,
    max_batch_size: int | None = None,
    single_thread_rows: int | None = None,
    lora: Any = None,
    dtype: str | None = None,
    lora_adapters: int = LORA_ADAPTERS_PER_BATCH,
) -> SGLangEngine:
    """Start the servers, wait until every one is healthy, return the engine that owns them.

    `on_log(server_index, line)` receives every log line (a notebook widget attaches here);
    logs also go to `log_dir/server-<i>.log` when `log_dir` is given. `max_batch_size`: the most
    requests each server decodes at once (sglang `--max-running-requests`, engine-server
    `--max-batch-size`); `single_thread_rows`: engine-server's `--single-thread-rows` (these servers
    share the machine with the trainer, so the Session passes its own setting, not a lone server's);
    `dtype`: the dtype the servers serve the model in (`--dtype`, SGLang's names; the Session passes
    `model.dtype`, the dtype its weight pushes come in; None: the servers' own default)."""
    if n_servers < 1:
        raise InvalidArgumentError(f"n_servers must be >= 1, got {n_servers}")
    if ports is not None and len(ports) != n_servers:
        raise InvalidArgumentError(f"{len(ports)} ports for {n_servers} servers")
    if lora is not None and server in ("sglang", "engine-server") and "--enable-lora" not in extra_args:
        extra_args = [*lora_server_args(lora.r, lora.target_modules, lora_adapters), *extra_args]
    commands = ServerCommands(
        server,
        model_path,
        host=host,
        tp_size=tp_size,
        dp_size=dp_size,
        mem_fraction_static=mem_fraction_static,
        api_key=api_key,
        weights_dir=weights_dir,
        extra_args=extra_args,
        n_servers=n_servers,
        max_batch_size=max_batch_size,
        single_thread_rows=single_thread_rows,
        dtype=dtype,
    )
    procs: list[ServerProcess] = []
    try:
        for i in range(n_servers):
            port = ports[i] if ports is not None else free_port(host)
            cmd = commands.line(port)
            connect_host = "127.0.0.1" if host in ("0.0.0.0", "") else host  # noqa: S104 - where we connect
            log_path = Path(log_dir) / f"server-{i}.log" if log_dir is not None else None
            callback = (lambda line, i=i: on_log(i, line)) if on_log is not None else None
            procs.append(
                ServerProcess(
                    cmd, f"http://{_bracket(connect_host)}:{port}", log_path=log_path, on_log=callback
                ).start()
            )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        for proc in procs:
            proc.wait_ready(timeout=ready_timeout, headers=headers)
        return SGLangEngine(
            [p.url for p in procs],
            api_key=api_key,
            weights_dir=weights_dir,
            config_source=model_path if Path(model_path).is_dir() else None,
            tokenizer=tokenizer,
            owned_processes=procs,
            max_context=max_context,
            lora=lora is not None,
        )
    except BaseException:
        for proc in procs:
            proc.stop()
        raise


def _unless_given(extra_args: Sequence[str], flag: str, value: Any) -> Any:
    """`value` for `flag`, or None when the user's own `extra_args` give the flag (theirs wins)."""
    return None if flag in extra_args else value


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class ServerCommands:
    """The settings every server of one launch shares (`launch_remote_engine`'s); `line(port)`
    is one server's command line."""

    server: str | Sequence[str]
    model_path: str
    host: str = "127.0.0.1"
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    api_key: str | None = None
    weights_dir: str | os.PathLike | None = None
    extra_args: Sequence[str] = ()
    n_servers: int = 1
    max_batch_size: int | None = None
    single_thread_rows: int | None = None
    dtype: str | None = None

    def line(self, port: int) -> list[str]:
        """The command line of the server listening on `port`."""
        server, extra_args = self.server, self.extra_args
        if server == "sglang":
            return sglang_command(
                self.model_path,
                host=self.host,
                port=port,
                tp_size=self.tp_size,
                dp_size=self.dp_size,
                mem_fraction_static=self.mem_fraction_static,
                api_key=self.api_key,
                max_running_requests=_unless_given(extra_args, "--max-running-requests", self.max_batch_size),
                dtype=_unless_given(extra_args, "--dtype", self.dtype),
                extra_args=extra_args,
            )
        if server == "engine-server":
            # the servers run on this machine, beside each other and the trainer: each gets its share of
            # the cores (two servers with 2 OpenMP threads each on 2 cores: ~45 s per demo step on a
            # loaded machine, against ~11 s with 1 each)
            threads = max(1, (os.cpu_count() or 1) // self.n_servers)
            for flag, value in (
                ("--max-batch-size", self.max_batch_size),
                ("--dtype", self.dtype),
                ("--single-thread-rows", self.single_thread_rows),
                ("--torch-threads", threads),
            ):
                if _unless_given(extra_args, flag, value) is not None:
                    extra_args = [*extra_args, flag, str(value)]
            return engine_server_command(
                self.model_path,
                host=self.host,
                port=port,
                api_key=self.api_key,
                weights_dir=self.weights_dir,
                extra_args=extra_args,
            )
        if isinstance(server, str):
            raise InvalidArgumentError(
                f"server must be 'sglang', 'engine-server' or a command list, got {server!r}"
            )
        fields = {
            "model": self.model_path,
            "host": self.host,
            "port": port,
            "api_key": self.api_key or "",
            "weights_dir": self.weights_dir or "",
        }
        return [part.format(**fields) for part in server] + list(extra_args)

"""`engine`: what generates the agents' tokens, and `engine.launch`: how `engine.type: sglang`
starts its servers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from areal_nb.engine.defaults import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_PREFIX_CACHE_TOKENS,
    DEFAULT_SINGLE_THREAD_ROWS,
)
from areal_nb.engine.factory import check_addresses
from areal_nb.errors import ConfigError

from .section import Section


class LaunchConfig(Section):
    """`engine.launch`: how `engine.type: sglang` starts its servers (areal_nb.engine.launch_remote_engine)."""

    command: Literal["sglang", "engine-server"] | list[str] = "sglang"
    """"sglang": `python -m sglang.launch_server`; "engine-server": `areal-nb engine-server` (CPU);
    or a command list with {model} {host} {port} {api_key} {weights_dir} filled in per server."""
    n_servers: int = Field(1, ge=1)
    """Servers to start; requests are spread over them."""
    host: str = "127.0.0.1"
    """The address the servers listen on."""
    ports: list[int] | None = None
    """One port per server; None: a free port for each."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per server (SGLang's --tp-size)."""
    dp_size: int = Field(1, ge=1)
    """Data-parallel replicas inside each server (SGLang's --dp-size)."""
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    """The share of GPU memory SGLang reserves for weights and KV cache; None: SGLang's default."""
    extra_args: list[str] = Field(default_factory=list)
    """More command-line arguments, appended as they are."""
    log_dir: str | None = None
    """Where each server's output goes; None: `<run_dir>/engine_logs`."""
    ready_timeout: float = Field(600.0, gt=0)
    """Seconds a server may take to become healthy before the start fails (`ServerLaunchError`)."""

    @property
    def gpus_per_server(self) -> int:
        """The GPUs one server holds: its tensor-parallel times its data-parallel size (also the
        layout of an exported cluster job's servers)."""
        return self.tp_size * self.dp_size

    @model_validator(mode="after")
    def _ports_match(self) -> LaunchConfig:
        if self.ports is not None and len(self.ports) != self.n_servers:
            raise ConfigError(
                f"engine.launch.ports lists {len(self.ports)} ports for n_servers={self.n_servers}"
            )
        return self


class EngineConfig(Section):
    """`engine`: what generates the agents' tokens (made by areal_nb.engine.create_engine)."""

    type: Literal["local", "sglang", "remote"] = "local"
    """"local": the embedded transformers engine; "sglang": the Session starts SGLang-API servers
    (`engine.launch`) and stops them on close(); "remote": servers someone else started, at
    `engine.addresses`."""
    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1)
    """Sequences decoded at once: the embedded engine's batch, or each launched server's
    `--max-running-requests`."""
    seed: int = 0
    """The engine's sampling seed. Left out of a session's config, it is the run's `seed`."""
    prefix_cache_tokens: int = Field(DEFAULT_PREFIX_CACHE_TOKENS, ge=0)
    """engine.type local: tokens of finished sequences' KV kept, so that a prompt continuing one
    (a multi-turn agent's next turn) prefills only its new tokens; 0: no prefix cache.
    `areal-nb engine-server --prefix-cache-tokens` is the same knob for the CPU servers."""
    single_thread_rows: int = Field(DEFAULT_SINGLE_THREAD_ROWS, ge=0)
    """engine.type local, CPU: decoding steps of at most this many rows run on one torch thread,
    fewer for models wider than the built-in ones (SmolLM2-135M: 18; `LocalEngine.single_thread_limit`)
    (0: all on torch's threads); `areal-nb engine-server --single-thread-rows` is the same knob."""
    addresses: list[str] = Field(default_factory=list)
    """engine.type remote: the servers' base URLs (`http://host:port`), one per server."""
    api_key: str | None = None
    """Sent to the servers as `Authorization: Bearer` (and given to the servers engine.type sglang
    launches); None: no key, or for engine.type remote the `AREAL_NB_API_KEY` environment variable."""
    weights_dir: str | None = None
    """Where the trainer writes new weights for the servers to load (a directory both can read).
    None: `<run_dir>/weights` for sglang; for remote, the weights go over the servers' own default."""
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    """How engine.type sglang starts its servers (`LaunchConfig`)."""

    @model_validator(mode="after")
    def _addresses(self) -> EngineConfig:
        check_addresses(self.type, self.addresses)
        return self

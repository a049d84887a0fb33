"""`create_engine`: the one place an engine is made from its config section.

The Session (and any script) asks for an engine here by `type`; new engine types are added
here, not in the Session, which passes everything any type may need and reads what the engine
can do from its declared capabilities (`InferenceEngine`; `engine_class` gives them before an
engine exists). "local": the embedded transformers engine (with `agents`, one per agent behind
an `AgentEngines`); "sglang": N SGLang-API
servers started here (`spec.launch`) and owned by the returned engine, which stops them on
`close()`; "remote": servers someone else started, at `spec.addresses`, with the key
`spec.api_key` or, when that is unset, the `AREAL_NB_API_KEY` environment variable (which
`areal-nb engine-server` reads too, so a job script keeps the key off every command line).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from areal_nb.api import InferenceEngine
from areal_nb.errors import ConfigError

ENGINE_TYPES = ("local", "sglang", "remote")
API_KEY_ENV = "AREAL_NB_API_KEY"  # the engine servers' key, read where no key is given


class EngineSpec(Protocol):
    """What the factory reads of a config section (`areal_nb.config.EngineConfig` is one)."""

    @property
    def type(self) -> str: ...

    max_batch_size: int
    seed: int
    # prefix_cache_tokens, single_thread_rows: int (read by "local" when present)
    # read by "sglang" / "remote" only (getattr: a spec for "local" may leave them out)
    # addresses: list[str]; api_key: str | None; launch: command, n_servers, host, ports, tp_size,
    # dp_size, mem_fraction_static, extra_args, ready_timeout


# One dispatch on `spec.type`, each branch the constructor call of one engine type with the
# arguments it reads: split per type, each branch would only restate its argument list.
def create_engine(
    spec: EngineSpec,
    model: Any,
    tokenizer: Any,
    *,
    model_path: str | None = None,
    device: Any = None,
    dtype: Any = None,
    weights_dir: str | None = None,
    log_dir: str | None = None,
    on_log: Callable[[int, str], None] | None = None,
    max_context: int | None = None,
    lora: Any = None,
    lora_adapters: int | None = None,
    agents: Sequence[str] = (),
    share_weights: bool = False,
) -> InferenceEngine:
    """An engine serving `model` (a loaded model, or a path for engines that load their own).

    `model_path` names the weights for engines that run out of process (a model directory the
    servers can read); `device` and `dtype` say where the embedded engine keeps its copy.
    `weights_dir` is where new weights are written for servers to load; `log_dir` and
    `on_log(server_index, line)` receive the launched servers' logs; `max_context` is the
    model's context length (servers do not report it); launched servers serve the model in
    `dtype` too. `lora` (`actor.lora`: `r`,
    `target_modules`): the servers serve LoRA adapters ("sglang" launches them with the LoRA flags,
    "remote" expects them started so) and the trainer pushes its adapter to them; the embedded
    engine ignores it (it serves the trainer's adapter tensors in place, or is pushed merged
    weights). `lora_adapters`: adapters the launched
    servers hold per batch (one adapter per agent: two per agent; None: the launcher's default).
    `agents`: with one adapter per agent, their names: the embedded engine can serve one merged
    policy at a time, so each agent gets an engine of its own (`AgentEngines`); servers apply
    each agent's adapter themselves (`lora`).
    `share_weights`: the embedded engine serves `model`'s parameters themselves where they are
    already on `device` in `dtype` (`LocalEngine(share_weights=)`); the other types ignore it.
    """
    if spec.type == "local":
        import torch

        from .defaults import DEFAULT_PREFIX_CACHE_TOKENS, DEFAULT_SINGLE_THREAD_ROWS
        from .local import LocalEngine

        def local(share: bool) -> LocalEngine:
            return LocalEngine(
                model if model is not None else _need_path(model_path, spec.type),
                tokenizer,
                device=device,
                dtype=dtype or torch.float32,
                max_batch_size=spec.max_batch_size,
                seed=spec.seed,
                prefix_cache_tokens=getattr(spec, "prefix_cache_tokens", DEFAULT_PREFIX_CACHE_TOKENS),
                single_thread_rows=getattr(spec, "single_thread_rows", DEFAULT_SINGLE_THREAD_ROWS),
                share_weights=share,
            )

        if agents:  # base + each agent's ΔW merged: an engine per agent
            from .agent_engines import AgentEngines

            return AgentEngines({agent: local(False) for agent in agents})  # (each its own merged weights)
        return local(share_weights)
    if spec.type == "sglang":
        from .defaults import DEFAULT_SINGLE_THREAD_ROWS
        from .remote_launch import launch_remote_engine

        launch = spec.launch  # type: ignore[attr-defined]
        return launch_remote_engine(
            _need_path(model_path, spec.type),
            server=launch.command,
            n_servers=launch.n_servers,
            host=launch.host,
            ports=launch.ports,
            tp_size=launch.tp_size,
            dp_size=launch.dp_size,
            mem_fraction_static=launch.mem_fraction_static,
            api_key=getattr(spec, "api_key", None),
            weights_dir=weights_dir,
            extra_args=launch.extra_args,
            log_dir=log_dir,
            on_log=on_log,
            ready_timeout=launch.ready_timeout,
            tokenizer=tokenizer,
            max_context=max_context,
            max_batch_size=spec.max_batch_size,
            single_thread_rows=getattr(spec, "single_thread_rows", DEFAULT_SINGLE_THREAD_ROWS),
            lora=lora,
            dtype=None if dtype is None else str(dtype).removeprefix("torch."),
            **({} if lora_adapters is None else {"lora_adapters": lora_adapters}),
        )
    if spec.type == "remote":
        from .sglang_client import SGLangEngine

        addresses = list(getattr(spec, "addresses", None) or [])
        if not addresses:
            raise ConfigError("engine.type='remote' needs addresses (the servers' base URLs)")
        api_key = getattr(spec, "api_key", None) or os.environ.get(API_KEY_ENV) or None
        return SGLangEngine(
            addresses,
            api_key=api_key,
            weights_dir=weights_dir,
            config_source=model_path if model_path and Path(model_path).is_dir() else None,
            tokenizer=tokenizer,
            max_context=max_context,
            lora=lora is not None,
            weights_may_differ=True,  # servers someone else started: whatever they loaded
        )
    raise ConfigError(
        f"engine.type={spec.type!r} is not available in this build; choose one of {list(ENGINE_TYPES)}"
    )


def engine_class(engine_type: str) -> type[InferenceEngine]:
    """The class `create_engine` makes for `engine_type`: its class attributes are that type's
    capabilities (`InferenceEngine`), for decisions taken before an engine exists (a config's
    checks). With `agents`, embedded engines sit behind an `AgentEngines`, which can do what
    each of them can."""
    if engine_type == "local":
        from .local import LocalEngine

        return LocalEngine
    if engine_type in ("sglang", "remote"):
        from .sglang_client import SGLangEngine

        return SGLangEngine
    raise ConfigError(
        f"engine.type={engine_type!r} is not available in this build; choose one of {list(ENGINE_TYPES)}"
    )


def check_addresses(engine_type: str, addresses: Sequence[str]) -> None:
    """Servers' addresses are what "remote" connects to: required there, refused with any other
    type (which would ignore them)."""
    if engine_type == "remote" and not addresses:
        raise ConfigError(
            "engine.type=remote needs engine.addresses (the servers' base URLs, "
            "e.g. ['http://127.0.0.1:30000'])"
        )
    if engine_type != "remote" and addresses:
        raise ConfigError(
            f"engine.addresses is only read with engine.type=remote (engine.type is {engine_type!r})"
        )


def _need_path(model_path: str | None, engine_type: str) -> str:
    if model_path is None:
        raise ConfigError(
            f"engine.type={engine_type!r} needs model_path: the model directory the servers load"
        )
    return model_path

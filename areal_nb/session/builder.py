"""Build a Session's components from its config: model, engine, actor, proxy, workflows.

Read top to bottom, this is what `Session.start()` does. Each function takes the config (and
what earlier steps built) and returns one component; nothing here keeps state.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.config import SessionConfig
from areal_nb.errors import ConfigError

from .evaluation import EVAL_PREFIX, GreedyEngine

if TYPE_CHECKING:
    from areal_nb.rollout.executor import RolloutExecutor
    from areal_nb.train import Actor

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def build_policy(cfg: SessionConfig) -> tuple[Any, torch.nn.Module]:
    """The tokenizer and the trainable policy on the configured device, in float32: its weights
    are the master weights; `model.dtype` is the dtype the actor computes in and the engine serves
    (`areal_nb.train.precision`)."""
    from areal_nb.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(cfg.model.path)
    policy = load_model(cfg.model.path, dtype=torch.float32, device=policy_device(cfg))
    return tokenizer, policy


def policy_device(cfg: SessionConfig) -> str:
    return cfg.model.device or ("cuda" if torch.cuda.is_available() else "cpu")


def build_engine(
    cfg: SessionConfig,
    policy: torch.nn.Module,
    tokenizer: Any,
    on_log: Callable[[int, str], None] | None = None,
    share_weights: bool = False,
) -> InferenceEngine:
    """The engine `engine.type` names (`engine.create_engine` chooses; this passes what any type
    may need). The embedded engine serves `policy`; server engines load the model by path
    (resolved here: the engine layer does not know the model registry), read new weights from
    `engine.weights_dir` (default `<run_dir>/weights`), and send launched servers' log lines to
    `engine_logs/server-<i>.log` and to `on_log(server_index, line)`.

    Called from the notebook's main thread: launched servers get SIGTERM when the thread that
    started them exits (launcher's parent-death signal), so not from a short-lived thread.

    `share_weights`: the embedded engine serves `policy`'s parameters themselves where it can
    (same device and dtype: `model.dtype` float32, the master weights' dtype), not a copy; with
    `actor.lora` the frozen base and the adapter tensors (`Actor.serve_in_place`), where they
    adapt linear layers only. Never with agent adapters (one engine per agent, each serving its
    merged policy)."""
    from areal_nb.engine import create_engine
    from areal_nb.models import resolve_model_path

    lora, lora_adapters = servers_lora(cfg)
    return create_engine(
        cfg.engine,
        policy,
        tokenizer,
        model_path=resolve_model_path(cfg.model.path),
        device=policy_device(cfg),
        dtype=getattr(torch, cfg.model.dtype),  # what the engine serves (and launched servers load)
        weights_dir=str(Path(cfg.engine.weights_dir or cfg.run_dir / "weights").absolute()),
        log_dir=str(Path(cfg.engine.launch.log_dir or cfg.run_dir / "engine_logs").absolute()),
        on_log=on_log,
        max_context=getattr(policy.config, "max_position_embeddings", None),
        # servers serve the policy's adapter, or each agent's (launched with the LoRA flags);
        # the embedded engine serves base + adapter in place, or base + ΔW merged (one engine
        # per agent)
        lora=lora,
        lora_adapters=lora_adapters,
        agents=list(cfg.agents),
        share_weights=share_weights and adapters_shareable(cfg, policy),
    )


def adapters_shareable(cfg: SessionConfig, policy: torch.nn.Module) -> bool:
    """Whether an embedded engine sharing `policy`'s tensors can serve the policy cfg trains: full
    fine-tuning, or one LoRA adapter on linear layers (served in place, `train.lora.in_place_adapters`)."""
    if cfg.agents:
        return False
    if cfg.actor.lora is None:
        return True
    from areal_nb.train.lora import adapts_linear_layers_only

    return adapts_linear_layers_only(policy, cfg.actor.lora)


def servers_lora(cfg: SessionConfig) -> tuple[Any, int | None]:
    """What engine servers are launched with for a LoRA run, as (LoRA settings, adapters per
    batch): `actor.lora` and the launcher's default; with `agents`, settings that admit every
    agent's adapter (the largest rank, every agent's target modules, "all-linear" when one adapts
    them all) and two adapters per agent (its current and next version). (None, None): no LoRA.
    The Session's launches and an exported job's `job.sbatch` both read it."""
    from areal_nb.train.lora import LoraConfig

    if not cfg.agents:
        return cfg.actor.lora, None
    adapters = list(cfg.agent_lora.values())
    targets: str | list[str] = (
        "all-linear"
        if any(isinstance(a.target_modules, str) for a in adapters)
        else list(dict.fromkeys(m for a in adapters for m in a.target_modules))
    )
    return LoraConfig(r=max(a.r for a in adapters), target_modules=targets), 2 * len(adapters)


def serve_in_place(actor: Actor, engine: InferenceEngine) -> None:
    """An embedded engine that serves the policy's parameters themselves (`build_engine`'s
    `share_weights`) is paused by the actor around its in-place updates (`Actor.serve_in_place`)."""
    if engine.shares_weights:
        actor.serve_in_place(engine)


def sync_agent_adapters(cfg: SessionConfig, actor: Actor, engine: InferenceEngine) -> None:
    """Servers that apply adapters get every agent's adapter at once, so each call names its
    agent's from the first one (and a call from another agent is refused from the start)."""
    if cfg.agents and engine.serves_lora_adapters:  # (embedded engines start as the base: B = 0)
        actor.push_weights(engine, actor.version)


def sync_engine_weights(cfg: SessionConfig, policy: torch.nn.Module, engine: InferenceEngine) -> None:
    """An engine whose weights may differ from `model.path`'s (servers someone else started)
    gets the trainer's once, at its own version, so recorded log-probs match the trainer.
    (Before the Actor is built: a sharded actor's weights are gathered by every rank.)"""
    if engine.weights_may_differ:
        from areal_nb.train.precision import serving_weights

        weights = serving_weights(policy.state_dict(), getattr(torch, cfg.model.dtype))
        engine.update_weights(weights, version=engine.get_version())


def engine_numerics(cfg: SessionConfig) -> Any:
    """How the embedded engine computes the log-probs it records (`train.EngineNumerics`), so the
    Actor can take them as π_prox where they are exactly its own (`train/engine_numerics.py`):
    the engine serves in `model.dtype` on the policy's device at `rollout.temperature`. None for
    server engines and for adapters (the engine serves merged weights). Every rank gets the same
    answer: under torchrun they must all skip the recomputation, or none."""
    from areal_nb.engine.factory import engine_class
    from areal_nb.train.engine_numerics import EngineNumerics

    if not engine_class(cfg.engine.type).serves_models_in_process or cfg.trains_adapters:
        return None
    return EngineNumerics(
        dtype=getattr(torch, cfg.model.dtype), device=policy_device(cfg), temperature=cfg.rollout.temperature
    )


def build_actor(
    cfg: SessionConfig, policy: torch.nn.Module, version: int = 0, parallel: Any = None, tokenizer: Any = None
) -> Actor:
    """The GRPO actor; with `actor.kl_ctl > 0` (and no `actor.lora`) also a reference model,
    a frozen copy of the initial policy (the KL penalty pulls towards where training started). `version`: the
    engine's weight version (servers that already served updates report theirs). `parallel`:
    this rank's `train.distributed.DataParallel` under torchrun."""
    from areal_nb.train import Actor

    actor_cfg = cfg.actor
    if actor_cfg.lr_schedule != "constant" and actor_cfg.lr_decay_steps is None:
        actor_cfg = dataclasses.replace(actor_cfg, lr_decay_steps=cfg.total_steps)  # the run's length
    ref_model = None
    if actor_cfg.kl_ctl > 0 and not cfg.trains_adapters:  # (LoRA: the base with the adapters off)
        ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
    return Actor(
        policy,
        actor_cfg,
        ref_model=ref_model,
        version=version,
        parallel=parallel,
        compute_dtype=getattr(torch, cfg.model.dtype),
        tokenizer=tokenizer,
        agent_lora=cfg.agent_lora or None,
        temperature=cfg.rollout.temperature,  # the trainer's log-probs are the sampler's
        engine_numerics=engine_numerics(cfg),
    )


# Inline agents reach the proxy in-process (no sockets; areal_nb.proxy.inprocess). False sends
# them over loopback HTTP like external agents: for benchmarks that measure the difference.
IN_PROCESS_AGENTS = True


@dataclass
class Proxy:
    app: Any  # the FastAPI app; its greedy evaluation twin is mounted at EVAL_PREFIX
    server: Any  # areal_nb.proxy.ProxyServer, started
    admin_key: str
    eval_app: Any = None  # the twin mounted at EVAL_PREFIX

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def eval_url(self) -> str:
        return self.server.url + EVAL_PREFIX

    def live_caches(self) -> dict[str, Any]:
        return self.app.state.proxy.live_caches()

    def stop(self) -> None:
        self.server.stop()


def build_proxy(cfg: SessionConfig, engine: InferenceEngine, tokenizer: Any) -> Proxy:
    """The proxy agents talk to, started on `agent.host:agent.port`.

    Agents that leave sampling out of their requests get `rollout.temperature`, `top_p` and
    `max_new_tokens`. The app mounted at `/eval` serves the same engine greedily (evaluation).
    """
    from areal_nb.capture import CompletionSettings
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    admin_key = cfg.agent.admin_api_key or secrets.token_urlsafe(24)
    completion = CompletionSettings(
        chat_template_type=cfg.agent.chat_template_type,
        engine_max_tokens=engine.max_context,
        default_temperature=cfg.rollout.temperature,
        default_top_p=cfg.rollout.top_p,
        default_max_new_tokens=cfg.rollout.max_new_tokens,
    )

    def settings() -> ProxySettings:
        return ProxySettings(
            admin_api_key=admin_key, session_timeout=cfg.agent.session_timeout, completion=completion
        )

    app = create_app(engine, tokenizer, settings())
    eval_app = create_app(GreedyEngine(engine), tokenizer, settings())
    app.mount(EVAL_PREFIX, eval_app)
    # The server stays up for external agents (subproc mode, other processes) and for agents
    # that build their own HTTP client instead of using the one they are given.
    server = ProxyServer(app, host=cfg.agent.host, port=cfg.agent.port)
    server.start()
    return Proxy(app=app, server=server, admin_key=admin_key, eval_app=eval_app)


def bind_session_judges(
    cfg: SessionConfig, agent: Any, policy: torch.nn.Module, tokenizer: Any, engine: InferenceEngine
) -> InferenceEngine | None:
    """Judges the agent holds with `engine="initial"` (`areal_nb.reward.judge`) get one engine of
    their own: a frozen copy of the initial policy, which no weight update reaches and whose calls
    never pass the proxy (so they are never recorded for training), made like `engine` (the
    Session's), which must serve models held in this process. None when no judge asks."""
    from areal_nb.reward.judge_llm import session_judges

    judges = session_judges(agent)
    if not judges:
        return None
    if not engine.serves_models_in_process:
        raise ConfigError(
            f'judge(..., engine="initial") runs on a frozen copy of the policy in an embedded engine; '
            f"with the engine type {cfg.engine.type!r} give the judge base_url= (a served copy) instead"
        )
    frozen = copy.deepcopy(policy).eval().requires_grad_(False)
    judge_engine = build_engine(
        cfg, frozen, tokenizer, share_weights=True
    )  # (nothing changes the frozen copy)
    for judge in judges:
        judge.bind_engine(judge_engine, tokenizer)
    return judge_engine


def build_workflow(cfg: SessionConfig, proxy: Proxy) -> RolloutWorkflow:
    """`agent.workflow` resolved with exactly `agent.workflow_kwargs` (nothing injected).

    Agents are wrapped to run through the proxy; each episode they receive the documented
    per-episode arguments (`base_url`, `api_key`, `http_client`, or the env vars in subproc mode).
    """
    from areal_nb.rollout.resolve import resolve_workflow

    return resolve_workflow(
        cfg.agent.workflow,
        dict(cfg.agent.workflow_kwargs),
        group_size=1,
        proxy_addr=proxy.url,
        admin_api_key=proxy.admin_key,
        **_proxy_workflow_kwargs(cfg),
        **_in_process_kwargs(cfg, proxy.app, proxy.app),
    )


def build_eval_workflow(cfg: SessionConfig, proxy: Proxy, workflow: RolloutWorkflow) -> RolloutWorkflow:
    """The same agent, talking to the greedy `/eval` proxy; a direct RolloutWorkflow is reused
    as it is (it gets the greedy engine view from the evaluation executor)."""
    from areal_nb.rollout.workflow import OpenAIProxyWorkflow

    if not isinstance(workflow, OpenAIProxyWorkflow):
        return workflow
    # In-process, requests to /eval/... are routed by the root app; sessions live in the twin.
    return OpenAIProxyWorkflow(
        agent=workflow.agent,
        proxy_addr=proxy.eval_url,
        admin_api_key=proxy.admin_key,
        **_proxy_workflow_kwargs(cfg),
        **_in_process_kwargs(cfg, proxy.app, proxy.eval_app),
    )


def _proxy_workflow_kwargs(cfg: SessionConfig) -> dict[str, Any]:
    # Every call as recorded (raw_calls): the RolloutBatch alone discounts (agent.turn_discount,
    # discount_mode), assigns credit and applies agent.export_style, so rewards are discounted once.
    # agent_timeout: the workflow times the agent's own run (a subproc pool's start-up is not on its clock)
    return {
        "mode": cfg.agent.mode,
        "raw_calls": True,
        "subproc_max_workers": cfg.agent.subproc_max_workers,
        "agent_timeout": cfg.agent.agent_timeout,
    }


def episode_timeout(cfg: SessionConfig, workflow: RolloutWorkflow) -> float | None:
    """The executor's bound on a whole episode: `agent.agent_timeout` for a workflow of the user's
    own (`RolloutWorkflow`); none for an agent behind the proxy, whose workflow bounds the agent
    itself (`agent_timeout`, then abandoning one that ignores its cancellation) and whose other
    steps (the worker pool's start, the session's calls on the proxy) are bounded each."""
    from areal_nb.rollout.workflow import OpenAIProxyWorkflow

    return None if isinstance(workflow, OpenAIProxyWorkflow) else cfg.agent.agent_timeout


def _in_process_kwargs(cfg: SessionConfig, asgi_app: Any, session_app: Any) -> dict[str, Any]:
    """Inline agents share the Session's process: serve their episodes without sockets."""
    if cfg.agent.mode != "inline" or not IN_PROCESS_AGENTS or session_app is None:
        return {}
    return {"asgi_app": asgi_app, "proxy_state": session_app.state.proxy}


def build_executor(cfg: SessionConfig, workflow: RolloutWorkflow, engine: InferenceEngine) -> RolloutExecutor:
    from areal_nb.rollout.executor import RolloutExecutor

    return RolloutExecutor(
        workflow,
        engine,
        group_size=cfg.rollout.group_size,
        batch_size=cfg.rollout.batch_size,
        max_head_offpolicyness=cfg.rollout.max_head_offpolicyness,
        max_concurrent=cfg.rollout.max_concurrent_rollouts,
        episode_timeout=episode_timeout(cfg, workflow),
        switch_interval=cfg.rollout.gil_switch_interval,
    )


def shutdown(runtime: Any, executor: Any, workflows: list[Any], parts: list[tuple[str, Any, str]]) -> None:
    """Release what a Session's start() built, in reverse order; every step runs even if one
    fails. `parts`: (name, object or None, its closing method), closed in that order."""
    if runtime is not None and executor is not None:
        try:
            runtime.call(executor.cancel_all(), timeout=30)
        except Exception as e:  # closing must go on
            logger.warning("cancelling rollouts failed: %s", e)
        executor.release_switch_interval()  # even if cancelling failed: the GIL setting is process-wide
    for workflow in {id(w): w for w in workflows if w is not None}.values():
        try:
            if hasattr(workflow, "aclose") and runtime is not None:
                runtime.call(workflow.aclose(), timeout=30)
            elif hasattr(workflow, "close"):
                workflow.close()
        except Exception as e:
            logger.warning("closing the workflow failed: %s", e)
    for name, part, stop in parts:
        if part is not None:
            try:
                getattr(part, stop)()
            except Exception as e:
                logger.warning("closing %s failed: %s", name, e)

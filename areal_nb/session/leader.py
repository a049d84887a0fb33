"""Rank 0's half of a Session: everything `start()` builds there, and its release on `close()`.

Under torchrun (WORLD_SIZE > 1) rank 0 runs the engine, the proxy, the rollouts, evaluation and
metrics, and writes checkpoints; the other ranks hold only actor replicas that follow it
(`parallel.py`'s `Ranks`: the messages between them). In one process the Session is rank 0 of 1
and has a `Leader` too. The Session's notebook methods check their call and hand rank 0's work
here; what this object holds exists only here, built in the order each part needs the others
(`build`) and released in reverse order (`shutdown`), also after a failed build.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.config import SessionConfig
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.widgets import EngineLog, view_batch

from . import builder
from .base_model import base_reference, check_same_base
from .checkpoint import restore
from .data import DataStream, load_task_data
from .evaluation import EvalResult, choose_problems, evaluate
from .metrics import MetricsSink, create_metrics_sink
from .overrides import plain_config
from .preflight import check_first_episode
from .rejections import rollout_until_accepted
from .run_state import RunState, rng_states, untrained_data_pos
from .runtime import LoopRuntime
from .step_stats import add_rollout_stats

if TYPE_CHECKING:
    from areal_nb.rollout.executor import RolloutExecutor
    from areal_nb.train import Actor
    from areal_nb.train.distributed import DataParallel

    from .parallel import Ranks

logger = logging.getLogger(__name__)


class Leader:
    """Rank 0's parts (module docstring). Made by `build`; until it returns, a part not built yet
    is absent (`shutdown` releases those that exist)."""

    tokenizer: Any  # a transformers tokenizer
    actor: Actor
    lora_base: dict[str, Any] | None  # actor.lora: the base's reference (base_model.py)
    engine: InferenceEngine
    proxy: builder.Proxy
    runtime: LoopRuntime
    workflow: RolloutWorkflow
    eval_workflow: RolloutWorkflow
    judge_engine: InferenceEngine | None  # judges' frozen initial policy (`engine="initial"`)
    executor: RolloutExecutor
    data: DataStream
    eval_problems: list[dict]
    metrics: MetricsSink | None
    restored: RunState | None  # after Session.load: the checkpoint's run

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.engine_log = EngineLog()  # the launched servers' log lines (Session.engine_log)
        self.first_episode_checked = False  # preflight.py, before the first rollout
        self.staleness_noted = False  # run()'s note on uncorrected off-policy tokens, said once

    @classmethod
    def start(cls, config: SessionConfig, resumed: dict[str, Any] | None, ranks: Ranks) -> Leader:
        """Rank 0's parts, built (`build`); on failure the other ranks hear of it (they wait in
        `Ranks.join`) and what was built so far is released: no thread or port outlives it."""
        lead = cls(config)
        try:
            lead.build(resumed, ranks.parallel)
        except BaseException as e:
            ranks.abort(e)
            lead.shutdown()
            raise
        return lead

    def build(self, resumed: dict[str, Any] | None, parallel: DataParallel | None) -> None:
        """Every part, in the order each needs the others (a bad dataset fails first), then the
        checkpoint's state after `Session.load` (`resumed`). Long, as the list of parts is; each
        line is one builder call. On failure the caller releases what was built (`shutdown`)."""
        cfg = self.config
        builder.seed_everything(cfg.seed)
        task_data = load_task_data(cfg.data, picklable=cfg.agent.mode == "subproc")
        self.tokenizer, policy = builder.build_policy(cfg)
        self.lora_base = base_reference(cfg.model.path, policy) if cfg.trains_adapters else None
        if resumed is not None:  # an adapter goes on the base it was trained on only
            check_same_base(resumed.get("base_model"), self.lora_base, resumed.get("folder", "checkpoint"))
        self.engine = engine = builder.build_engine(
            cfg,
            policy,
            self.tokenizer,
            on_log=self.engine_log.append,
            share_weights=parallel is None,  # (data-parallel: replicas or shards)
        )
        builder.sync_engine_weights(cfg, policy, engine)
        self.actor = builder.build_actor(
            cfg, policy, version=engine.get_version(), parallel=parallel, tokenizer=self.tokenizer
        )
        builder.serve_in_place(self.actor, engine)
        builder.sync_agent_adapters(cfg, self.actor, engine)
        self.proxy = proxy = builder.build_proxy(cfg, engine, self.tokenizer)
        self.runtime = runtime = LoopRuntime(on_interrupt=self.cancel_rollouts)
        self.workflow = workflow = builder.build_workflow(cfg, proxy)
        self.eval_workflow = builder.build_eval_workflow(cfg, proxy, workflow)
        agent = getattr(workflow, "agent", None)  # (a proxy workflow's agent, whose judges bind here)
        self.judge_engine = builder.bind_session_judges(cfg, agent, policy, self.tokenizer, engine)
        self.executor = runtime.call(self._make_executor())
        self.eval_problems = task_data.held_out
        self.data = DataStream(cfg.data, rows=task_data.train, index=task_data.train_index)
        self.executor.describe_row = lambda row: self.data.describe(row)  # (the stream Ctrl-C rewinds)
        self.metrics = create_metrics_sink(
            cfg.logging.backend, run_dir=cfg.run_dir, project=cfg.experiment_name, config=plain_config(cfg)
        )
        self.restored = None
        if resumed is not None:
            self.restored = run = restore(self.actor, engine, resumed)
            self.data = self.data.at(run.data_pos)

    async def _make_executor(self) -> RolloutExecutor:
        # Made on the loop that will drive it (it owns asyncio primitives).
        return builder.build_executor(self.config, self.workflow, self.engine)

    # ------------------------------------------------------------------ rollouts and evaluation
    async def check_first_episode(self) -> None:
        """Once, before the first rollout: the agent must succeed on the first training row."""
        if self.first_episode_checked:
            return
        first = self.data.first_row()
        index = self.data.source_index(first)
        await check_first_episode(
            self.eval_workflow, self.engine, first, row_index=0 if index is None else index
        )
        self.first_episode_checked = True

    async def rollout(self, n: int) -> RolloutBatch:
        """`n` groups: those `run()` generated ahead first, then new ones at the current version."""
        await self.check_first_episode()
        start = time.perf_counter()
        for _ in range(max(0, n - self.executor.n_waiting)):
            self.executor.submit(next(self.data))
        groups = await self.executor.wait_groups(n)
        batch = self.make_batch([ep for group in groups for ep in group])
        add_rollout_stats(batch, time.perf_counter() - start)
        return batch

    def on_new_version(self) -> None:
        """After a training step pushed new weights: the executor's staleness bound moves on."""
        self.runtime.call_soon(self.executor.on_version_change)

    def accepted_batch(self, rollout: Callable[[], RolloutBatch | None]) -> RolloutBatch | None:
        """`rollout()` (the Session's) until a batch has an accepted episode (`rejections.py`);
        the staleness bound forgets each wholly rejected one."""

        def discard(batch: RolloutBatch) -> None:  # (before the next rollout, on the loop)
            self.runtime.call_soon(self.executor.staleness.on_discard, len(batch.episodes))

        source_index = lambda row: self.data.source_index(row)  # noqa: E731 - (the stream Ctrl-C rewinds)
        return rollout_until_accepted(rollout, discard, source_index, logger)

    async def evaluate(
        self, n: int | None, problems: list[dict] | None, pass_k: int | None, held_out: list[dict]
    ) -> EvalResult:
        picklable = self.config.agent.mode == "subproc"
        rows, rows_name = choose_problems(problems, n, held_out, picklable=picklable)
        rollout = self.config.rollout
        return await evaluate(
            rows,
            rows_name=rows_name,
            pass_k=pass_k,
            max_concurrent=rollout.max_concurrent_rollouts,
            episode_timeout=builder.episode_timeout(self.config, self.eval_workflow),
            switch_interval=rollout.gil_switch_interval,
            engine=self.engine,
            eval_workflow=self.eval_workflow,
            sample_workflow=self.workflow,
            make_batch=self.make_batch,
        )

    def make_batch(self, episodes: list) -> RolloutBatch:
        agent = self.config.agent
        return RolloutBatch(
            episodes,
            style=agent.export_style,
            discount=agent.turn_discount,
            discount_mode=agent.discount_mode,
            version=self.engine.get_version(),
            tokenizer=self.tokenizer,
            credit=self.config.actor.credit,
            viewer=view_batch,
        )

    async def cancel_rollouts(self) -> None:
        """Ctrl-C (`runtime.py`): the rollouts stop, and the rows of groups drawn and not handed out
        (the latest rows drawn) come again: Ctrl-C must not skip data that was never trained on."""
        dropped = self.executor.n_waiting
        await self.executor.cancel_all()
        if dropped:
            self.data = self.data.at(self.data.pos - dropped)

    # ------------------------------------------------------------------ the run's record
    def run_state(self, history: list[dict[str, Any]]) -> RunState:
        """The run's progress now: what a checkpoint records besides the weights (`run_state.py`)."""
        data_pos = untrained_data_pos(lambda: self.data, self.executor, self.runtime)
        actor = self.actor
        return RunState(
            actor.version, actor.steps_done, data_pos, rng_states(), self.engine.rng_state(), list(history)
        )

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.log(step, metrics)

    def shutdown(self) -> None:
        """Release what `build` made, in reverse order (`builder.shutdown`); parts a failed build
        never made are skipped."""
        part = vars(self).get
        builder.shutdown(
            part("runtime"),
            part("executor"),
            [part("workflow"), part("eval_workflow")],
            [
                ("metrics", part("metrics"), "close"),
                ("proxy", part("proxy"), "stop"),
                ("engine", part("engine"), "close"),
                ("judge_engine", part("judge_engine"), "close"),
                ("runtime", part("runtime"), "close"),
            ],
        )

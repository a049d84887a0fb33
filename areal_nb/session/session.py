"""The Session: engine, proxy, rollouts and GRPO training inside one notebook kernel.

This module is the notebook API only: each method checks its call and hands the work to the
module that does it. `builder.py` makes the components from the config, `runtime.py` runs the
background event loop (and Ctrl-C), `data.py` streams the task data, `step_stats.py` makes the
history rows, `run_loop.py` is `run()`'s cadence (prefetch, evaluation and checkpoint steps, the
progress bar), `evaluation.py` runs greedy evaluation episodes, `checkpoint.py` saves and restores
runs (`run_state.py`: the progress it records), `metrics.py` sends stats to TensorBoard/wandb.

Threads (docs/design.md §3): the engine decodes in its own worker thread; the proxy server runs
uvicorn in its own thread; one background thread runs the Session's asyncio loop, where the
rollout executor and the agents' HTTP clients live. Notebook methods are sync facades over
that loop (`rollout`, `train_step`, `run`, ...), with `a`-prefixed async twins for `await`.
Training runs in the calling thread.

Under torchrun (WORLD_SIZE > 1) rank 0 is this whole Session and the other ranks hold only
actor replicas that follow it (`parallel.py`'s `Ranks`): same user code on every rank,
data-parallel updates.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.config import SessionConfig, load_config
from areal_nb.errors import CallOrderError, ExportError
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.train import distributed
from areal_nb.widgets import EngineLog, view_batch

from . import builder, run_loop
from .base_model import base_reference, check_same_base
from .checkpoint import CheckpointError, read_checkpoint, restore, save_checkpoint  # noqa: F401
from .data import DataStream, load_task_data
from .diagnostics import SignalWatch
from .dynamic_sampling import refill_informative
from .evaluation import EvalResult, choose_problems, evaluate
from .guard import CLOSED_MESSAGE, OneCallAtATime, SessionBusyError, SessionClosedError, one_call  # noqa: F401
from .metrics import MetricsSink, create_metrics_sink
from .overrides import flatten_overrides, load_overrides, plain_config, with_datasets
from .parallel import Ranks
from .preflight import check_first_episode
from .rejections import rollout_until_accepted
from .run_loop import uncorrected_staleness_note  # noqa: F401 (re-exported)
from .run_state import RunState, rng_states, untrained_data_pos
from .runtime import LoopRuntime
from .step_stats import add_rollout_stats, history_row

if TYPE_CHECKING:
    from areal_nb.rollout.executor import RolloutExecutor
    from areal_nb.train import Actor, LossInspection

logger = logging.getLogger(__name__)

T = TypeVar("T")

_LIVE_SESSIONS: weakref.WeakSet = weakref.WeakSet()


class Session:
    """`Session(config | yaml_path | None, **overrides)`; see docs/getting-started.md for a tour.

    Overrides are dotted keys written with `__` (`actor__lr=1e-5`) or section dicts
    (`rollout={"batch_size": 4}`). `dataset` / `eval_dataset` set `data.source` / `data.eval_source`:
    a list of dicts, a pandas DataFrame, a `datasets.Dataset` or a JSONL/JSON/Parquet/CSV/TSV path.

    Misuse is refused, never guessed at (`guard.py`): a Session runs one call at a time, and a
    call from a second thread while one runs raises `SessionBusyError` naming both calls (calls
    nested in one thread's call, `step` → `rollout`, are that call); every method of a closed
    Session raises `SessionClosedError` (`start()` too; `close()` may be called again, from any
    thread). `Session.load` checks the checkpoint's files before it starts anything
    (`CheckpointError` naming the file), and a load that fails after starting stops what it started.
    """

    # set by start() on every rank
    actor: Actor
    tokenizer: Any  # a transformers tokenizer

    def __init__(
        self,
        config: SessionConfig | str | Path | dict | None = None,
        *,
        start: bool = True,
        dataset: Any = None,
        eval_dataset: Any = None,
        **overrides: Any,
    ) -> None:
        self.config: SessionConfig = load_config(config, with_datasets(overrides, dataset, eval_dataset))
        self._staleness_noted = False  # run()'s note on uncorrected off-policy tokens, said once
        self.last_batch: RolloutBatch | None = None
        self.last_inspection: LossInspection | None = None  # from train_step(batch, inspect=True)
        self._history: list[dict[str, Any]] = []
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._started = self._closed = self._first_episode_checked = False  # (preflight.py: the last)
        self._calls = OneCallAtATime()  # guard.py: one call at a time, refused from a second thread
        self._resume_state: dict[str, Any] | None = None  # Session.load's checkpoint, until start()
        self.lora_base: dict[str, Any] | None = None  # actor.lora: the base's reference (base_model.py)
        self._signal_watch = SignalWatch()  # diagnostics.py: says when steps teach nothing
        self._ranks = Ranks(None)  # under torchrun: this rank's place and rank 0's protocol (start())
        # built by start() on rank 0 only (ranks ≠ 0 hold just the actor); the methods reach them
        # through the `_rank0_*` accessors below, which name what is missing instead of failing on None
        self.engine: InferenceEngine | None = None
        self._proxy: builder.Proxy | None = None
        self._runtime: LoopRuntime | None = None
        self.executor: RolloutExecutor | None = None
        self.data: DataStream | None = None
        self._metrics: MetricsSink | None = None
        self.workflow: RolloutWorkflow | None = None
        self._eval_workflow: RolloutWorkflow | None = None
        self._judge_engine: Any = None
        self.eval_problems: list[dict] = []
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    @one_call
    def start(self) -> Session:
        """Build the model, engine, actor and proxy, and start the background loop."""
        if self._closed:
            raise SessionClosedError(CLOSED_MESSAGE)
        if self._started:
            return self
        self._ranks = Ranks.from_env()
        if self.rank == 0:
            try:
                self._build()
            except BaseException as e:
                self._ranks.abort(e)  # the other ranks wait in Ranks.join
                self._shutdown()  # what was built so far: no thread or port outlives a failed start
                self._closed = True
                raise
        else:  # only the actor, on this rank's device; rank 0 restores a checkpoint and sends its state
            builder.seed_everything(self.config.seed)
            self.tokenizer, policy = builder.build_policy(self.config)
            self.actor = builder.build_actor(
                self.config, policy, parallel=self._ranks.parallel, tokenizer=self.tokenizer
            )
        self._started = True
        _LIVE_SESSIONS.add(self)
        try:
            self._ranks.join(self.actor, self._resume_state if self.rank == 0 else None, self.engine)
        except BaseException:
            self.close()
            raise
        self._resume_state = None
        return self

    def _build(self) -> None:
        """Rank 0's start: every component, in the order each needs the others (a bad dataset
        fails first), then the checkpoint's state after `Session.load`. Long, as the list of
        parts is; each line is one builder call."""
        cfg, resumed = self.config, self._resume_state
        builder.seed_everything(cfg.seed)
        task_data = load_task_data(cfg.data, picklable=cfg.agent.mode == "subproc")
        self.tokenizer, policy = builder.build_policy(cfg)
        if cfg.trains_adapters:  # what a checkpoint names instead of copying the base
            self.lora_base = base_reference(cfg.model.path, policy)
        if resumed is not None:  # an adapter goes on the base it was trained on only
            check_same_base(resumed.get("base_model"), self.lora_base, resumed.get("folder", "checkpoint"))
        self._engine_log = EngineLog()
        self.engine = engine = builder.build_engine(
            cfg,
            policy,
            self.tokenizer,
            on_log=self._engine_log.append,
            share_weights=self._ranks.parallel is None,  # (data-parallel: replicas or shards)
        )
        builder.sync_engine_weights(cfg, policy, engine)
        self.actor = builder.build_actor(
            cfg, policy, version=engine.get_version(), parallel=self._ranks.parallel, tokenizer=self.tokenizer
        )
        builder.serve_in_place(self.actor, engine)
        builder.sync_agent_adapters(cfg, self.actor, engine)
        self._proxy = proxy = builder.build_proxy(cfg, engine, self.tokenizer)
        self._runtime = runtime = LoopRuntime(on_interrupt=self._cancel_rollouts)
        self.workflow = workflow = builder.build_workflow(cfg, proxy)
        self._eval_workflow = builder.build_eval_workflow(cfg, proxy, workflow)
        agent = getattr(workflow, "agent", None)
        self._judge_engine = builder.bind_session_judges(cfg, agent, policy, self.tokenizer, engine)
        self.executor = runtime.call(self._make_executor())
        self.eval_problems = task_data.held_out
        self.data = DataStream(cfg.data, rows=task_data.train, index=task_data.train_index)
        self.executor.describe_row = self._describe_row
        self._metrics = create_metrics_sink(
            cfg.logging.backend, run_dir=cfg.run_dir, project=cfg.experiment_name, config=plain_config(cfg)
        )
        if resumed is not None:  # (Session.load) inside start's guard: a failure stops all of it
            run = restore(self, resumed)
            self.data, self._history = self.data.at(run.data_pos), list(run.history)

    @property
    def version(self) -> int:
        """The policy version the engine serves (the actor's: one more per training step)."""
        actor = getattr(self, "actor", None)  # (none before start())
        return 0 if actor is None else actor.version

    @property
    def step_count(self) -> int:
        """Training steps taken in this run (counted by the actor; a loaded run goes on counting)."""
        actor = getattr(self, "actor", None)
        return 0 if actor is None else actor.steps_done

    @property
    def rank(self) -> int:
        """This process's rank under torchrun (0 in one process): rank 0 runs the engine, proxy
        and rollouts and writes checkpoints; other ranks train replicas of the actor."""
        return self._ranks.rank

    @property
    def world_size(self) -> int:
        return self._ranks.world_size

    def close(self) -> None:
        """Stop rollouts, the proxy, the engine and the loop thread. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._shutdown()
        _LIVE_SESSIONS.discard(self)

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def proxy_url(self) -> str:
        """Agents point `base_url` here (+ "/v1")."""
        return self._live_proxy().url

    @property
    def admin_key(self) -> str:
        return self._live_proxy().admin_key

    @property
    def app(self) -> Any:
        """The proxy's FastAPI app."""
        return self._live_proxy().app

    def _live_proxy(self) -> builder.Proxy:
        self._check_open()
        return self._rank0_proxy

    @one_call
    def proxy_caches(self) -> dict[str, Any]:
        """The live InteractionCache of every session currently open in the proxy (training only)."""
        return self._rank0_proxy.live_caches()

    @one_call
    def engine_log(self) -> EngineLog:
        """The launched engine servers' log lines (`engine.type: sglang`) as a notebook view;
        the full logs are in `<run_dir>/engine_logs/` (or `engine.launch.log_dir`)."""
        return self._engine_log

    @one_call
    def add_step_callback(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """`fn(stats)` runs after every training step (the dashboard uses this)."""
        self._callbacks.append(fn)

    @property
    def history(self):
        """One row of stats per training step, as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame.from_records(self._history)

    # ------------------------------------------------------------------ rollout
    @one_call
    def rollout(self, n_prompts: int | None = None) -> RolloutBatch | None:
        """Run `n_prompts` × `group_size` episodes (default: rollout.batch_size prompts).

        Groups already generated in the background by `run()` come first (they are within
        `max_head_offpolicyness`); new ones are generated now, at the current policy version.
        On ranks ≠ 0 (torchrun) there is no rollout: None (their `train_step` takes rank 0's batch).
        """
        self._check_open()
        if self.rank != 0:
            return None
        return self._rank0_runtime.call(self.arollout(n_prompts))

    async def arollout(self, n_prompts: int | None = None) -> RolloutBatch:
        self._check_open()
        n = n_prompts or self.config.rollout.batch_size
        await self._check_first_episode()
        executor, data = self._rank0_executor, self._rank0_data
        start = time.perf_counter()
        for _ in range(max(0, n - executor.n_waiting)):
            executor.submit(next(data))
        groups = await executor.wait_groups(n)
        batch = self._batch([ep for group in groups for ep in group])
        add_rollout_stats(batch, time.perf_counter() - start)
        self.last_batch = batch
        return batch

    # ------------------------------------------------------------------ training
    @one_call
    def train_step(self, batch: RolloutBatch | None, inspect: bool = False) -> dict[str, float]:
        """One GRPO update on `batch`; the new weights go to the engine as version + 1.

        `inspect=True` keeps the update's per-token values (advantage, ratio, clipping,
        behaviour weight, entropy, loss share) in `self.last_inspection`; `show_loss(session)`
        draws them on the token chips.

        Under torchrun every rank calls it: rank 0 sends its batch, the others ignore theirs
        (None) and each trains its share of the rows; the stats are the whole batch's.
        """
        self._check_open()
        step = self._ranks.share_batch(batch, inspect)
        self._ranks.in_train_step = True  # a failure from here on is inside the ranks' collectives
        stats = dict(
            self.actor.train_step(step.batch, credit=step.credit, inspect=step.inspect, agents=step.agents)
        )
        self._ranks.in_train_step = False
        if step.inspect:
            self.last_inspection = self.actor.last_inspection
            if batch is not None and self.last_inspection is not None and len(batch.agents) > 1:
                self.last_inspection.agents = [row.agent for row in batch.rows()]  # to_tensors' order
        self.actor.push_weights(self.engine)  # every rank: FSDP gathers the weights
        if self.engine is not None:  # rank 0
            self._rank0_runtime.call_soon(self._rank0_executor.on_version_change)
        row = history_row(self.step_count, self.version, batch if self.rank == 0 else None, stats)
        self._history.append(row)
        self._signal_watch.observe(row)
        self._after_step(row)
        return row

    async def atrain_step(self, batch: RolloutBatch, inspect: bool = False) -> dict[str, float]:
        return await asyncio.to_thread(self.train_step, batch, inspect)

    @one_call
    def compare(self, batch: RolloutBatch, variants: dict[str, dict[str, Any]], *, trial_step: bool = False):
        """`batch` under several algorithms, side by side, without training (`lab.py`).

        `variants`: name → actor knobs, e.g. `{"grpo": {}, "dr_grpo": {}, "gspo": {"eps_clip": 1e-3}}`
        (a preset's name selects it). Returns a `Comparison`: `.table` (a DataFrame, one row per
        variant: loss, clipped/masked fractions, gradient norm, cosine of its gradient with each
        other's), `.view()` (token lanes); `trial_step=True` adds the KL each update would cause.
        Weights, optimizer state and RNG states are left exactly as they were."""
        from .lab import compare

        self._check_open()
        return compare(self, batch, variants, trial_step=trial_step)

    @one_call
    def step(self) -> dict[str, float]:
        """Rollout + train. A batch whose every episode was rejected is not trained on: another is
        rolled out (`rejections.py`); `MAX_EMPTY_BATCHES` such batches in a row raise
        `RolloutRejectedError` listing the reasons and the rows they hit. With
        `actor.dynamic_sampling` (DAPO) groups whose rewards are all equal are dropped and the
        batch refilled (`dynamic_sampling.py`)."""
        batch = self._rollout_with_accepted_episodes()
        if batch is not None and self.config.actor.dynamic_sampling:
            batch = refill_informative(batch, self.rollout, self.config.actor.dynamic_sampling_max_rounds)
        return self.train_step(batch)

    def _rollout_with_accepted_episodes(self) -> RolloutBatch | None:
        def discard(batch: RolloutBatch) -> None:  # (before the next rollout, on the loop)
            self._rank0_runtime.call_soon(self._rank0_executor.staleness.on_discard, len(batch.episodes))

        source_index = lambda row: self._rank0_data.source_index(row)  # noqa: E731 - (rank 0 only)
        return rollout_until_accepted(self.rollout, discard, source_index, logger)

    @one_call
    def run(self, steps: int | None = None, *, progress: bool | None = None) -> Any:
        """Train for `steps` steps, rollouts running ahead within the staleness bound (`run_loop.py`).

        Every `logging.eval_every` steps the row also gets `evaluate()`'s figures
        (`eval_reward`, `eval_accuracy`, `eval_agent_accuracy`); every `checkpoint.save_every`
        steps a checkpoint goes to `checkpoint.save_dir/step<N>` (rank 0 only, under torchrun).
        """
        self._check_open()
        steps = self.config.total_steps if steps is None else steps
        if self.rank != 0:  # a replica: one training step per step of rank 0's
            run_loop.follow(self, steps)
            return self.history
        try:
            runtime = self._rank0_runtime
            runtime.call(self._check_first_episode())  # before background rollouts start
            note = uncorrected_staleness_note(self.config)
            if note is not None and not self._staleness_noted:
                logger.warning(note)
                self._staleness_noted = True
            run_loop.lead(
                self,
                steps,
                show=self.config.logging.progress if progress is None else progress,
                runtime=runtime,
                executor=self._rank0_executor,
                data=self._rank0_data,
                log_metrics=self._log_metrics,
                still_open=lambda: not self._closed,
            )
        except BaseException as e:
            self._ranks.abort_unless_in_step(e)  # the other ranks wait for the next step's batch
            raise
        return self.history

    # ------------------------------------------------------------------ evaluation
    @one_call
    def evaluate(
        self, n: int | None = None, *, problems: list[dict] | None = None, pass_k: int | None = None
    ) -> EvalResult | None:
        """Greedy episodes of the configured agent on the held-out split (or on `problems`).

        The agent runs exactly as in training — same workflow, same engine and weights — except
        that every generation is greedy. Returns an `EvalResult`: `reward_mean` (mean episode
        return), `accuracy` (first call rewarded: first-reply accuracy for the math agent),
        `agent_accuracy` (some call rewarded: success within the agent's turns), and the
        episodes as `.batch`. Nothing is trained on and the policy version does not move.
        With `pass_k=k` it also samples k episodes per problem at `rollout.temperature` and
        reports `pass_at_k`, the share of problems solved (some call rewarded) at least once.
        Only rank 0 evaluates (torchrun): other ranks get None.
        """
        self._check_open()
        if self.rank != 0:
            return None
        return self._rank0_runtime.call(self.aevaluate(n, problems=problems, pass_k=pass_k))

    async def aevaluate(
        self, n: int | None = None, *, problems: list[dict] | None = None, pass_k: int | None = None
    ) -> EvalResult:
        self._check_open()
        picklable = self.config.agent.mode == "subproc"
        rows, rows_name = choose_problems(problems, n, self.eval_problems, picklable=picklable)
        rollout, eval_workflow = self.config.rollout, self._rank0_eval_workflow
        return await evaluate(
            rows,
            rows_name=rows_name,
            pass_k=pass_k,
            max_concurrent=rollout.max_concurrent_rollouts,
            episode_timeout=builder.episode_timeout(self.config, eval_workflow),
            switch_interval=rollout.gil_switch_interval,
            engine=self._rank0_engine,
            eval_workflow=eval_workflow,
            sample_workflow=self._rank0_workflow,
            make_batch=self._batch,
        )

    # ------------------------------------------------------------------ checkpoints
    @one_call
    def save(self, path: str | Path) -> Path:
        """Model, optimizer, step, version, RNG states, data position, config and history.

        Under torchrun every rank calls it and only rank 0 writes (the replicas are equal); the
        others return when the checkpoint is complete (so they may `Session.load` it next)."""
        self._check_open()
        actor_state = self.actor.state_dict()  # every rank: FSDP gathers the full tensors
        ref_weights = self.actor.ref_weights()  # (likewise; None without kl_ctl)
        return self._ranks.written_by_rank_0(
            lambda: save_checkpoint(self, path, actor_state, ref_weights, run=self._run_state())
        )

    @one_call
    def save_pretrained(self, path: str | Path, *, merged: bool = True, agent: str | None = None) -> Path:
        """The current policy as a Hugging Face folder that `transformers` loads (weights in
        `model.dtype`, config, generation config, tokenizer with its chat template). With
        `actor.lora`, `merged=False` writes the adapter for `peft.PeftModel.from_pretrained`
        instead (`hf_export.py`). With one adapter per agent (`agents`), `agent` names whose
        policy to write. Under torchrun only rank 0 writes."""
        from .hf_export import save_pretrained

        self._check_open()
        write = self._ranks.written_by_rank_0
        if self.config.agents or agent is not None:  # (agent adapters do not shard: nothing to gather)
            return write(lambda: save_pretrained(self, path, merged=merged, agent=agent))
        if not merged and not self.actor.lora:
            raise ExportError(
                "save_pretrained(merged=False) writes a LoRA adapter; this run trains full weights "
                "(no actor.lora): use merged=True"
            )
        # every rank: FSDP gathers them (LoRA: base + ΔW merged, or the adapter alone)
        weights = self.actor.policy_weights() if merged else self.actor.adapter_weights()
        return write(lambda: save_pretrained(self, path, merged=merged, weights=weights))

    @classmethod
    def load(
        cls, path: str | Path, *, config: SessionConfig | str | Path | None = None, **overrides: Any
    ) -> Session:
        """A Session that continues the saved run; `config` replaces the saved config.yaml
        (an exported run's train.py passes the folder's own). Under torchrun, rank 0 reads the
        state and sends it to the other ranks."""
        # every file checked before anything starts (CheckpointError naming the file)
        state = read_checkpoint(path, check_config=config is None) if distributed.env_rank() == 0 else None
        overrides = load_overrides(path, config, overrides)
        session = cls(Path(path) / "config.yaml" if config is None else config, start=False, **overrides)
        session._resume_state = state
        return session.start()

    def _run_state(self) -> RunState:
        """The run's progress now: what a checkpoint records besides the weights (`run_state.py`)."""
        data_pos = untrained_data_pos(lambda: self._rank0_data, self.executor, self._runtime)
        engine_rng = self._rank0_engine.rng_state()
        return RunState(
            self.version, self.step_count, data_pos, rng_states(), engine_rng, list(self._history)
        )

    # ------------------------------------------------------------------ export
    @one_call
    def export(
        self, path: str | Path, *, checkpoint: bool = True, overwrite: bool = False, **overrides: Any
    ) -> Path:
        """Write a run folder that continues this run as a batch job: config.yaml (every override
        applied), train.py, the agent (its import path, or agent.py with its source taken from
        the notebook cells), requirements.txt, README.md, launch_local.sh (torchrun) and
        job.sbatch (Slurm, from the `cluster` config section), and with `checkpoint` the current
        state, so the job goes on from this step. Raises ExportError naming what cannot travel.
        `overrides` change the job's config only (`total_steps=200, cluster__nodes=2`), as
        `areal-nb export`'s key=value do; this Session keeps its own.

        Under torchrun every rank calls it (the same script runs everywhere): each takes part in
        gathering the weights (FSDP shards them), rank 0 writes the folder, the others return its path."""
        from areal_nb.export import export_run

        self._check_open()
        config = load_config(self.config, flatten_overrides(overrides)) if overrides else self.config
        gathered = None
        if checkpoint and self._ranks.channel is not None:
            gathered = (self.actor.state_dict(), self.actor.ref_weights())  # every rank: the gathers
        return self._ranks.written_by_rank_0(
            lambda: export_run(
                path, config, session=self, checkpoint=checkpoint, overwrite=overwrite, gathered=gathered
            )
        )

    # ------------------------------------------------------------------ widgets
    @one_call
    def dashboard(self):
        """Live training curves, updated after every step."""
        from areal_nb.widgets import Dashboard

        return Dashboard(self)

    def __repr__(self) -> str:
        status = "closed" if self._closed else ("running" if self._started else "not started")
        url = self._proxy.url if self._proxy is not None else None
        return (
            f"Session({status}, model={self.config.model.path!r}, step={self.step_count}, "
            f"version={self.version}, proxy={url!r})"
        )

    # ------------------------------------------------------------------ plumbing
    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(CLOSED_MESSAGE)
        if not self._started:
            self.start()

    async def _check_first_episode(self) -> None:
        """Once, before the first rollout: the agent must succeed on the first training row."""
        if self._first_episode_checked:
            return
        data = self._rank0_data
        first = data.first_row()
        index = data.source_index(first)
        await check_first_episode(
            self._rank0_eval_workflow, self._rank0_engine, first, row_index=0 if index is None else index
        )
        self._first_episode_checked = True

    def _describe_row(self, row: dict) -> str | None:
        return self.data.describe(row) if self.data is not None else None

    async def _make_executor(self) -> RolloutExecutor:
        # Made on the loop that will drive it (it owns asyncio primitives).
        return builder.build_executor(self.config, self._rank0_workflow, self._rank0_engine)

    def _shutdown(self) -> None:
        """Release whatever `start()` built, in reverse order (`builder.shutdown`)."""
        builder.shutdown(
            self._runtime,
            self.executor,
            [self.workflow, self._eval_workflow],
            [
                ("metrics", self._metrics, "close"),
                ("proxy", self._proxy, "stop"),
                ("engine", self.engine, "close"),
                ("judge_engine", self._judge_engine, "close"),
                ("runtime", self._runtime, "close"),
            ],
        )

    async def _cancel_rollouts(self) -> None:
        executor = self._rank0_executor
        dropped = executor.n_waiting  # groups drawn and not handed out: the latest rows drawn
        await executor.cancel_all()
        if dropped:  # their rows come again (Ctrl-C must not skip data that was never trained on)
            data = self._rank0_data
            self.data = data.at(data.pos - dropped)

    def _batch(self, episodes: list) -> RolloutBatch:
        agent = self.config.agent
        return RolloutBatch(
            episodes,
            style=agent.export_style,
            discount=agent.turn_discount,
            discount_mode=agent.discount_mode,
            version=self._rank0_engine.get_version(),
            tokenizer=self.tokenizer,
            credit=self.config.actor.credit,
            viewer=view_batch,
        )

    def _after_step(self, row: dict[str, Any]) -> None:
        self._log_metrics(row["step"], row)
        for fn in list(self._callbacks):
            try:
                fn(row)
            except Exception as e:  # a broken widget must not stop training
                logger.warning("step callback %r failed: %s", fn, e)

    def _log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.log(step, metrics)

    # What start() builds on rank 0 only. The methods that use them run on rank 0 after start();
    # None here means a call that rank (or a Session whose start failed) cannot serve.
    _rank0_engine = property(lambda self: _built(self.engine, "engine"))
    _rank0_proxy = property(lambda self: _built(self._proxy, "proxy"))
    _rank0_runtime = property(lambda self: _built(self._runtime, "event loop"))
    _rank0_executor = property(lambda self: _built(self.executor, "rollout executor"))
    _rank0_data = property(lambda self: _built(self.data, "training data"))
    _rank0_workflow = property(lambda self: _built(self.workflow, "workflow"))
    _rank0_eval_workflow = property(lambda self: _built(self._eval_workflow, "evaluation workflow"))


def _built(part: T | None, name: str) -> T:
    if part is None:
        raise CallOrderError(
            f"this Session has no {name}: it is built by start(), on rank 0 only (under torchrun the "
            "other ranks hold just the actor)"
        )
    return part


@atexit.register
def _close_all_sessions() -> None:
    for session in list(_LIVE_SESSIONS):
        try:
            session.close()
        except Exception:
            pass

"""The Session: engine, proxy, rollouts and GRPO training inside one notebook kernel.

This module is the user-facing API only; the parts live beside it, named for what they do:
`builder.py` makes the components from the config, `runtime.py` runs the background event loop
(and Ctrl-C), `data.py` streams the task data, `evaluation.py` runs greedy evaluation
episodes, `checkpoint.py` saves and restores runs, `metrics.py` sends stats to TensorBoard/wandb.

Threads (docs/design.md §3): the engine decodes in its own worker thread; the proxy server runs
uvicorn in its own thread; one background thread runs the Session's asyncio loop, where the
rollout executor and the agents' HTTP clients live. Notebook methods are sync facades over
that loop (`rollout`, `train_step`, `run`, ...), with `a`-prefixed async twins for `await`.
Training runs in the calling thread.

Under torchrun (WORLD_SIZE > 1) rank 0 is this whole Session and the other ranks hold only
actor replicas that follow it (`parallel.py`): same user code on every rank, data-parallel updates.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.config import SessionConfig, load_config, to_dict
from areal_nb.data import check_rows, load_rows
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.learning_signal import progress_note, signal_stats
from areal_nb.train import distributed
from areal_nb.widgets import EngineLog, view_batch

from . import builder
from .base_model import BASE_FILE, base_reference, check_same_base
from .checkpoint import CheckpointError, read_checkpoint, restore, save_checkpoint  # noqa: F401
from .data import DataStream, load_task_data
from .diagnostics import SignalWatch
from .dynamic_sampling import refill_informative
from .evaluation import EVAL_COLUMNS, EvalResult, pass_at_k, run_episodes, run_greedy_episodes, summarize
from .guard import CLOSED_MESSAGE, OneCallAtATime, SessionBusyError, SessionClosedError, one_call  # noqa: F401
from .metrics import MetricsSink, create_metrics_sink
from .parallel import RankChannel
from .preflight import check_first_episode
from .rejections import MAX_EMPTY_BATCHES, RolloutRejectedError, empty_batch_message
from .run_state import RunState, rng_states
from .runtime import LoopRuntime

if TYPE_CHECKING:
    from areal_nb.rollout.executor import RolloutExecutor
    from areal_nb.train import Actor, LossInspection

logger = logging.getLogger(__name__)

T = TypeVar("T")

_LIVE_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def _flatten_overrides(overrides: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`rollout={"batch_size": 4}` or `rollout__batch_size=4` → {"rollout.batch_size": 4}.

    Values stay Python objects, so an agent instance or class can be passed as
    `agent__workflow=MyAgent()`. A dict value for `workflow_kwargs` is kept whole.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        path = prefix + key.replace("__", ".")
        if isinstance(value, dict) and value and not path.endswith("workflow_kwargs"):
            out.update(_flatten_overrides(value, path + "."))
        else:
            out[path] = value
    return out


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
        flat = _flatten_overrides(overrides)
        for key, value in (("data.source", dataset), ("data.eval_source", eval_dataset)):
            if value is not None:
                # a one-shot iterator is read once here; the Session (and save()) need its rows again
                flat[key] = value if hasattr(value, "__len__") or isinstance(value, Path) else list(value)
        self.config: SessionConfig = load_config(config, flat)
        self._staleness_noted = False  # run()'s note on uncorrected off-policy tokens, said once
        self.last_batch: RolloutBatch | None = None
        self.last_inspection: LossInspection | None = None  # from train_step(batch, inspect=True)
        self._history: list[dict[str, Any]] = []
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._started = False
        self._closed = False
        self._calls = OneCallAtATime()  # guard.py: one call at a time, refused from a second thread
        self._resume_state: dict[str, Any] | None = None
        self.lora_base: dict[str, Any] | None = None  # actor.lora: the base's reference (base_model.py)
        self._first_episode_checked = False  # see preflight.py
        self._signal_watch = SignalWatch()  # diagnostics.py: says when steps teach nothing
        self._parallel: distributed.DataParallel | None = None  # under torchrun: this rank's place
        self._channel: RankChannel | None = None
        self._in_train_step = False  # rank 0 inside the ranks' collective training step
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
        cfg = self.config
        self._parallel = distributed.init_from_env()
        if self._parallel is not None:
            self._channel = RankChannel(self._parallel)
        if self.rank != 0:
            return self._start_replica()
        try:
            builder.seed_everything(cfg.seed)
            # data first: a bad dataset fails before anything is built
            task_data = load_task_data(cfg.data, picklable=cfg.agent.mode == "subproc")
            self.tokenizer, policy = builder.build_policy(cfg)
            if cfg.trains_adapters:  # what a checkpoint names instead of copying the base
                self.lora_base = base_reference(cfg.model.path, policy)
            if self._resume_state is not None:  # an adapter goes on the base it was trained on only
                check_same_base(
                    self._resume_state.get("base_model"),
                    self.lora_base,
                    self._resume_state.get("folder", "checkpoint"),
                )
            self._engine_log = EngineLog()
            self.engine = engine = builder.build_engine(
                cfg, policy, self.tokenizer, on_log=self._engine_log.append
            )
            builder.sync_engine_weights(cfg, policy, engine)
            self.actor = builder.build_actor(
                cfg,
                policy,
                version=engine.get_version(),
                parallel=self._parallel,
                tokenizer=self.tokenizer,
            )
            builder.sync_agent_adapters(cfg, self.actor, engine)
            self._proxy = proxy = builder.build_proxy(cfg, engine, self.tokenizer)
            self._runtime = runtime = LoopRuntime(on_interrupt=self._cancel_rollouts)
            self.workflow = workflow = builder.build_workflow(cfg, proxy)
            self._eval_workflow = builder.build_eval_workflow(cfg, proxy, workflow)
            self._judge_engine = builder.bind_session_judges(
                cfg, getattr(workflow, "agent", None), policy, self.tokenizer
            )
            self.executor = executor = runtime.call(self._make_executor())
            self.eval_problems = task_data.held_out
            self.data = DataStream(cfg.data, rows=task_data.train, index=task_data.train_index)
            executor.describe_row = self._describe_row
            self._metrics = create_metrics_sink(
                cfg.logging.backend,
                run_dir=cfg.run_dir,
                project=cfg.experiment_name,
                config=_plain(self.config),
            )
            if self._resume_state is not None:  # (Session.load) inside the guard: a failure stops all of it
                run = restore(self, self._resume_state)
                self.data, self._history = self.data.at(run.data_pos), list(run.history)
        except BaseException as e:
            if self._channel is not None:
                self._channel.abort(e)  # the other ranks wait in _join_replicas
            self._shutdown()  # what was built so far: no thread or port outlives a failed start
            self._closed = True
            raise
        self._started = True
        _LIVE_SESSIONS.add(self)
        try:
            self._join_replicas()
        except BaseException:
            self.close()
            raise
        self._resume_state = None
        return self

    def _start_replica(self) -> Session:
        """Rank ≠ 0: only the actor, on this rank's device, then rank 0's weights and state."""
        builder.seed_everything(self.config.seed)
        self.tokenizer, policy = builder.build_policy(self.config)
        self.actor = builder.build_actor(
            self.config, policy, parallel=self._parallel, tokenizer=self.tokenizer
        )
        self._started = True
        _LIVE_SESSIONS.add(self)
        self._resume_state = None  # rank 0 restores the checkpoint and sends its state
        try:
            self._join_replicas()
        except BaseException:
            self.close()
            raise
        return self

    def _join_replicas(self) -> None:
        """Every rank starts from rank 0's weights, optimizer state, version and step."""
        parallel, channel = self._parallel, self._channel
        if parallel is None or channel is None:  # one process (both are set together under torchrun)
            return
        actor = self.actor
        resumed = self._resume_state  # rank 0 after Session.load: the checkpoint's full optimizer state
        # A sharded reference after Session.load: rank 0 restored only its own shards, and the
        # others built theirs from the saved policy, so every rank cuts its shards from the
        # checkpoint's full reference weights (replicas get rank 0's by broadcast_module below).
        ref_state = resumed.get("ref_model") if resumed is not None and actor.sharded else None
        # Likewise a sharded LoRA adapter: the others hold fresh adapters on the base they loaded
        adapters = resumed["actor"]["model"] if resumed is not None and actor.sharded and actor.lora else None
        state = channel.send(
            "start",
            {
                "version": actor.version,
                "steps_done": actor.steps_done,
                "optimizer": resumed["actor"]["optimizer"] if resumed is not None else None,
                "ref_model": ref_state if actor.ref_model is not None else None,
                "adapters": adapters,
            }
            if self.rank == 0
            else None,
        )
        if self.rank != 0 and state["ref_model"] is not None:
            actor.load_ref_weights(state["ref_model"])
        if self.rank != 0 and state["adapters"] is not None:
            actor.load_adapter_weights(state["adapters"])
        parallel.broadcast_module(actor.model)
        if actor.ref_model is not None:
            parallel.broadcast_module(actor.ref_model)
        if self.rank != 0:
            actor.version, actor.steps_done = state["version"], state["steps_done"]
            if state["optimizer"] is not None:
                actor.load_optimizer_state_dict(state["optimizer"])
        if state["adapters"] is not None:  # the restored base + ΔW, merged from every rank's shards
            actor.push_weights(self.engine if self.rank == 0 else None)

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

    def _run_state(self) -> RunState:
        """The run's progress now: what a checkpoint records besides the weights (`run_state.py`)."""
        return RunState(
            version=self.version,
            steps=self.step_count,
            data_pos=self._untrained_data_pos(),
            rng=rng_states(),
            engine_rng=self._rank0_engine.rng_state(),
            history=list(self._history),
        )

    def _untrained_data_pos(self) -> int:
        """The data position before the groups drawn and not handed out for training yet (fetched
        ahead by `run()` with `rollout.prefetch`): a resumed run generates them again, at its own
        version, instead of skipping their rows. Read on the loop, where the executor draws rows,
        so the position and the waiting groups are one consistent state."""
        executor, runtime = self.executor, self._runtime
        if executor is None or runtime is None:
            return self._rank0_data.pos

        def position() -> int:
            return self._rank0_data.pos - executor.n_waiting

        async def read() -> int:
            return position()

        return position() if runtime.on_loop() else runtime.call(read())  # (the loop never waits on itself)

    @property
    def rank(self) -> int:
        """This process's rank under torchrun (0 in one process): rank 0 runs the engine, proxy
        and rollouts and writes checkpoints; other ranks train replicas of the actor."""
        return 0 if self._parallel is None else self._parallel.rank

    @property
    def world_size(self) -> int:
        return 1 if self._parallel is None else self._parallel.world_size

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
        elapsed = time.perf_counter() - start
        accepted = [i for i, ep in enumerate(batch.episodes) if ep.accepted]
        out_tokens = sum(
            c.model_response.output_len
            for i in accepted
            for c in batch.calls(i)
            if c.model_response is not None
        )
        returns = [batch.episode_return(i) for i in accepted]
        batch.stats.update(
            {
                "rollout_s": elapsed,
                "episodes": len(batch.episodes),
                "rejected": len(batch.rejected),
                "reward_mean": sum(returns) / len(returns) if returns else float("nan"),
                "generated_tokens": out_tokens,
                "rollout_tokens_per_s": out_tokens / elapsed if elapsed > 0 else float("nan"),
            }
        )
        agent_means = batch.agent_reward_means()
        if len(agent_means) > 1:  # several agents: each one's mean return per episode, by name
            batch.stats.update({f"reward_mean/{agent}": mean for agent, mean in agent_means.items()})
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
        message: dict[str, Any] | None = None
        if self.rank == 0:
            if batch is None:
                raise TypeError("train_step() needs a RolloutBatch (from rollout()), got None")
            # the batch's credit (config's actor.credit, or a reexport's) is what its views showed
            message = {
                "tensors": batch.to_tensors(),
                "credit": batch.credit,
                "inspect": inspect,
                "agents": batch.agents,
            }
        if self._channel is not None:
            message = self._channel.send("train", message)  # ranks ≠ 0 receive rank 0's
        assert message is not None, "a rank ≠ 0 runs under torchrun, so with a channel"
        tensors = message["tensors"]
        self._in_train_step = True  # a failure from here on is inside the ranks' collectives
        stats = dict(
            self.actor.train_step(
                tensors,
                tensors["group_ids"],
                credit=message["credit"],
                inspect=message["inspect"],
                agents=message["agents"],
            )
        )
        self._in_train_step = False
        if message["inspect"]:
            self.last_inspection = self.actor.last_inspection
            if batch is not None and self.last_inspection is not None and len(batch.agents) > 1:
                self.last_inspection.agents = [row.agent for row in batch.rows()]  # to_tensors' order
        self.actor.push_weights(self.engine)  # every rank: FSDP gathers the weights
        if self.engine is not None:  # rank 0
            self._rank0_runtime.call_soon(self._rank0_executor.on_version_change)
        # the batch's figures, and whether it can teach anything (zero_signal_groups, ...: learning_signal.py)
        rollout_stats = {**batch.stats, **signal_stats(batch)} if batch is not None and self.rank == 0 else {}
        row = {"step": self.step_count, **rollout_stats, **stats}
        if "reward_mean" in rollout_stats:
            # `reward_mean` is the mean episode return (as `evaluate()`'s); the trainer's mean over
            # its rows (one per call, discounted rewards) is kept beside it
            row["row_reward_mean"] = stats.get("reward_mean", float("nan"))
            row["reward_mean"] = rollout_stats["reward_mean"]
        row["version"] = self.version  # the version the engine serves after this step
        for key in EVAL_COLUMNS:  # filled in by run() on evaluation steps
            row.setdefault(key, float("nan"))
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
        empty: list[RolloutBatch] = []
        while True:
            batch = self.rollout()
            if batch is None or batch.accepted:  # None: a rank ≠ 0, which trains on rank 0's batch
                return batch
            empty.append(batch)
            # not trained: its episodes stop holding staleness budget (before the next rollout, on the loop)
            self._rank0_runtime.call_soon(self._rank0_executor.staleness.on_discard, len(batch.episodes))
            message = empty_batch_message(empty, self._rank0_data.source_index)
            if len(empty) >= MAX_EMPTY_BATCHES:
                raise RolloutRejectedError(message)
            logger.warning(
                "%s\nrolling out another batch (%d of at most %d)", message, len(empty) + 1, MAX_EMPTY_BATCHES
            )

    @one_call
    def run(self, steps: int | None = None, *, progress: bool | None = None) -> Any:
        """Train for `steps` steps, rollouts running ahead within the staleness bound.

        Every `logging.eval_every` steps the row also gets `evaluate()`'s figures
        (`eval_reward`, `eval_accuracy`, `eval_agent_accuracy`); every `checkpoint.save_every`
        steps a checkpoint goes to `checkpoint.save_dir/step<N>` (rank 0 only, under torchrun).
        """
        self._check_open()
        cfg = self.config
        steps = cfg.total_steps if steps is None else steps
        if self.rank != 0:  # a replica: one training step per step of rank 0's
            for _ in range(steps):
                self.train_step(None)
                if (due := self._checkpoint_due()) is not None:
                    self.save(due)
            return self.history
        try:
            return self._run(steps, progress)
        except BaseException as e:
            if self._channel is not None and not self._in_train_step:
                self._channel.abort(e)  # the other ranks wait for the next step's batch
            raise

    def _run(self, steps: int, progress: bool | None) -> Any:
        from tqdm.auto import tqdm

        cfg = self.config
        runtime, executor = self._rank0_runtime, self._rank0_executor
        runtime.call(self._check_first_episode())  # before background rollouts start
        if cfg.rollout.prefetch:
            note = uncorrected_staleness_note(cfg)
            if note is not None and not self._staleness_noted:
                logger.warning(note)
                self._staleness_noted = True
            runtime.call_soon(executor.set_feeder, self._rank0_data)
        show = cfg.logging.progress if progress is None else progress
        bar = tqdm(total=steps, desc=f"GRPO {cfg.experiment_name}", disable=not show)
        try:
            for _ in range(steps):
                row = self.step()
                if cfg.logging.eval_every and self.step_count % cfg.logging.eval_every == 0:
                    figures = runtime.call(self.aevaluate()).as_dict()  # evaluate() on rank 0
                    row.update(figures)  # the history row is this dict
                    self._log_metrics(self.step_count, figures)
                if (due := self._checkpoint_due()) is not None:
                    self.save(due)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{row.get('reward_mean', float('nan')):.3f}",
                    loss=f"{row.get('loss', 0):.4f}",
                    **progress_note(row),  # most groups without signal: what to try
                )
        finally:
            bar.close()
            if cfg.rollout.prefetch and not self._closed:
                runtime.call_soon(executor.set_feeder, None)
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
        rows_name = "held-out row" if problems is None else "problems row"
        if problems is not None:  # any form a dataset may take (a DataFrame, a path, ...), checked like one
            problems = load_rows(problems, name="problems")
            if problems:
                check_rows(problems, name="problems", picklable=self.config.agent.mode == "subproc")
        problems = list(self.eval_problems if problems is None else problems)[: n or None]
        if not problems:
            raise ValueError(
                "evaluate() needs at least one problem: this dataset has no held-out rows; pass "
                "eval_dataset=..., set data.eval_fraction, or call evaluate(problems=rows)"
            )
        if pass_k is not None and (isinstance(pass_k, bool) or not isinstance(pass_k, int) or pass_k < 1):
            raise ValueError(f"pass_k must be an int >= 1, got {pass_k!r}")
        rollout, engine, eval_workflow = self.config.rollout, self._rank0_engine, self._rank0_eval_workflow
        timeout = builder.episode_timeout(self.config, eval_workflow)
        result = summarize(
            self._batch(
                await run_greedy_episodes(
                    eval_workflow,
                    engine,
                    problems,
                    rows_name=rows_name,
                    max_concurrent=rollout.max_concurrent_rollouts,
                    episode_timeout=timeout,
                    switch_interval=rollout.gil_switch_interval,
                )
            )
        )
        if pass_k is None:
            return result
        samples = self._batch(
            await run_episodes(
                self._rank0_workflow,
                engine,
                problems,
                group_size=pass_k,
                rows_name=rows_name,
                max_concurrent=rollout.max_concurrent_rollouts,
                episode_timeout=timeout,
                switch_interval=rollout.gil_switch_interval,
            )
        )
        return dataclasses.replace(result, k=pass_k, pass_at_k=pass_at_k(samples, pass_k), samples=samples)

    # ------------------------------------------------------------------ checkpoints
    @one_call
    def save(self, path: str | Path) -> Path:
        """Model, optimizer, step, version, RNG states, data position, config and history.

        Under torchrun every rank calls it and only rank 0 writes (the replicas are equal); the
        others return when the checkpoint is complete (so they may `Session.load` it next)."""
        self._check_open()
        actor_state = self.actor.state_dict()  # every rank: FSDP gathers the full tensors
        ref_weights = self.actor.ref_weights()  # (likewise; None without kl_ctl)
        return self._written_by_rank_0(
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
        if self.config.agents or agent is not None:  # (agent adapters do not shard: nothing to gather)
            return self._written_by_rank_0(lambda: save_pretrained(self, path, merged=merged, agent=agent))
        if not merged and not self.actor.lora:
            raise ValueError(
                "save_pretrained(merged=False) writes a LoRA adapter; this run trains full weights "
                "(no actor.lora): use merged=True"
            )
        # every rank: FSDP gathers them (LoRA: base + ΔW merged, or the adapter alone)
        weights = self.actor.policy_weights() if merged else self.actor.adapter_weights()
        return self._written_by_rank_0(lambda: save_pretrained(self, path, merged=merged, weights=weights))

    def _written_by_rank_0(self, write: Callable[[], str | Path]) -> Path:
        """`write()` on rank 0 and its path on every rank: the others wait for it (a "saved"
        message), or raise rank 0's error when it failed."""
        path: str | Path | None = None
        if self.rank == 0:
            try:
                path = write()
            except BaseException as e:
                if self._channel is not None:
                    self._channel.abort(e)
                raise
        if self._channel is not None:
            path = self._channel.send("saved", str(path) if self.rank == 0 else None)
        assert path is not None, "a rank ≠ 0 runs under torchrun, so with a channel"
        return Path(path)

    @classmethod
    def load(
        cls, path: str | Path, *, config: SessionConfig | str | Path | None = None, **overrides: Any
    ) -> Session:
        """A Session that continues the saved run; `config` replaces the saved config.yaml
        (an exported run's train.py passes the folder's own). Under torchrun, rank 0 reads the
        state and sends it to the other ranks."""
        # every file checked before anything starts (CheckpointError naming the file)
        state = read_checkpoint(path, check_config=config is None) if distributed.env_rank() == 0 else None
        if (
            config is None
            and (Path(path) / "model").is_dir()
            and not (Path(path) / BASE_FILE).exists()  # (LoRA: config.yaml names the base itself)
            and "model.path" not in _flatten_overrides(overrides)
        ):
            # the saved config.yaml names the model folder by the absolute path it was written at,
            # which is gone once the checkpoint is moved or copied (an exported run's folder, a
            # job's result brought back from the cluster): the folder beside it is that model
            overrides = {**overrides, "model__path": str((Path(path) / "model").resolve())}
        session = cls(Path(path) / "config.yaml" if config is None else config, start=False, **overrides)
        session._resume_state = state
        return session.start()

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
        config = load_config(self.config, _flatten_overrides(overrides)) if overrides else self.config
        gathered = None
        if checkpoint and self._channel is not None:
            gathered = (self.actor.state_dict(), self.actor.ref_weights())  # every rank: the gathers
        return self._written_by_rank_0(
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
    def _checkpoint_due(self) -> Path | None:
        """Where this step's checkpoint goes, when `checkpoint.save_every` says one is due."""
        cfg = self.config.checkpoint
        if cfg.save_dir and cfg.save_every and self.step_count % cfg.save_every == 0:
            return Path(cfg.save_dir) / f"step{self.step_count}"
        return None

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
        """Release whatever `start()` built, in reverse order; every step runs even if one fails."""
        runtime, executor = getattr(self, "_runtime", None), getattr(self, "executor", None)
        if runtime is not None and executor is not None:
            try:
                runtime.call(executor.cancel_all(), timeout=30)
            except Exception as e:  # closing must go on
                logger.warning("cancelling rollouts failed: %s", e)
            executor.release_switch_interval()  # even if cancelling failed: the GIL setting is process-wide
        workflows = [getattr(self, "workflow", None), getattr(self, "_eval_workflow", None)]
        for workflow in {id(w): w for w in workflows if w is not None}.values():
            try:
                if hasattr(workflow, "aclose") and runtime is not None:
                    runtime.call(workflow.aclose(), timeout=30)
                elif hasattr(workflow, "close"):
                    workflow.close()
            except Exception as e:
                logger.warning("closing the workflow failed: %s", e)
        for name, stop in (
            ("_metrics", "close"),
            ("_proxy", "stop"),
            ("engine", "close"),
            ("_judge_engine", "close"),
            ("_runtime", "close"),
        ):
            part = getattr(self, name, None)
            if part is not None:
                try:
                    getattr(part, stop)()
                except Exception as e:
                    logger.warning("closing %s failed: %s", name.lstrip("_"), e)

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
    @property
    def _rank0_engine(self) -> InferenceEngine:
        return _built(self.engine, "engine")

    @property
    def _rank0_proxy(self) -> builder.Proxy:
        return _built(self._proxy, "proxy")

    @property
    def _rank0_runtime(self) -> LoopRuntime:
        return _built(self._runtime, "event loop")

    @property
    def _rank0_executor(self) -> RolloutExecutor:
        return _built(self.executor, "rollout executor")

    @property
    def _rank0_data(self) -> DataStream:
        return _built(self.data, "training data")

    @property
    def _rank0_workflow(self) -> RolloutWorkflow:
        return _built(self.workflow, "workflow")

    @property
    def _rank0_eval_workflow(self) -> RolloutWorkflow:
        return _built(self._eval_workflow, "evaluation workflow")


def _built(part: T | None, name: str) -> T:
    if part is None:
        raise RuntimeError(
            f"this Session has no {name}: it is built by start(), on rank 0 only (under torchrun the "
            "other ranks hold just the actor)"
        )
    return part


def _plain(cfg: SessionConfig) -> dict[str, Any]:
    """The config as JSON-able data (an agent object given in Python is named by its repr, a
    dataset given in Python by its type and length, not its rows)."""
    import json

    data = to_dict(cfg)
    for key in ("source", "eval_source"):
        value = data["data"][key]
        if value is not None and not isinstance(value, str):
            size = len(value) if hasattr(value, "__len__") else "?"
            data["data"][key] = f"<{type(value).__name__} of {size} rows>"
    return json.loads(json.dumps(data, default=repr))


@atexit.register
def _close_all_sessions() -> None:
    for session in list(_LIVE_SESSIONS):
        try:
            session.close()
        except Exception:
            pass


def uncorrected_staleness_note(cfg: SessionConfig) -> str | None:
    """What run() says when its rollouts run ahead of training without the decoupled loss: those
    tokens, sampled up to `max_head_offpolicyness` versions ago, then train with plain PPO, whose
    ratio takes no account of the older policy that sampled them (with `recompute_logprob`, AReaL's
    default, it is taken against the current weights). On the demo config that lost 7.5 held-out
    points where the decoupled loss gained 23.5 (benchmarks/prefetch_learning.py, variant on_plain)."""
    rollout = cfg.rollout
    if not rollout.prefetch or rollout.max_head_offpolicyness == 0 or cfg.actor.use_decoupled_loss:
        return None
    return (
        f"run() generates rollouts up to rollout.max_head_offpolicyness={rollout.max_head_offpolicyness} "
        "versions ahead of training (rollout.prefetch), and actor.use_decoupled_loss is off: those tokens "
        "train with plain PPO, uncorrected for the older policy that sampled them (on the demo config this "
        "made held-out accuracy fall). Set actor.use_decoupled_loss=true (the behaviour-weighted loss), or "
        "rollout.prefetch=false / rollout.max_head_offpolicyness=0 to train on-policy"
    )

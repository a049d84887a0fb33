"""The Session: engine, proxy, rollouts and GRPO training inside one notebook kernel.

This module is the notebook API only: each method checks its call and hands the work to the
module that does it (the package docstring lists them); `leader.py` holds what rank 0 builds.

Threads (docs/design.md §3): the engine decodes in its own worker thread; the proxy server runs
uvicorn in its own thread; one background thread runs the Session's asyncio loop, where the
rollout executor and the agents' HTTP clients live. Notebook methods are sync facades over
that loop (`rollout`, `train_step`, `run`, ...), with `a`-prefixed async twins for `await`.
Training runs in the calling thread.

Under torchrun (WORLD_SIZE > 1) rank 0 is this whole Session (its `Leader`) and the other ranks
hold only actor replicas that follow it (`parallel.py`'s `Ranks`): same user code on every rank,
data-parallel updates; rank 0 alone writes (`rank_writes.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_nb.config import SessionConfig, load_config
from areal_nb.errors import CallOrderError
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.train import distributed
from areal_nb.widgets import EngineLog

from . import guard, rank_writes, run_loop
from .checkpoint import read_checkpoint
from .dynamic_sampling import refill_informative
from .evaluation import EvalResult
from .guard import CLOSED_MESSAGE, OneCallAtATime, SessionClosedError, one_call
from .leader import Leader
from .overrides import flatten_overrides, load_overrides, with_datasets
from .parallel import Ranks
from .run_loop import uncorrected_staleness_note  # noqa: F401 (re-exported)
from .run_state import RunState
from .step_stats import StepHistory, history_row

if TYPE_CHECKING:
    from areal_nb.train import Actor, LossInspection

logger = logging.getLogger(__name__)


class Session(guard.Closing):
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
    `with Session(...) as s:` closes it at the end (`guard.Closing`).
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
        self.last_batch: RolloutBatch | None = None
        self.last_inspection: LossInspection | None = None  # from train_step(batch, inspect=True)
        self._steps = StepHistory()  # the history rows; the metrics and callbacks after each step
        self._started = self._closed = False
        self._calls = OneCallAtATime()  # guard.py: one call at a time, refused from a second thread
        self._resume_state: dict[str, Any] | None = None  # Session.load's checkpoint, until start()
        self.lora_base: dict[str, Any] | None = None  # actor.lora: the base's reference (base_model.py)
        self.eval_problems: list[dict] = []  # the held-out rows evaluate() plays by default
        self._ranks = Ranks(None)  # under torchrun: this rank's place and rank 0's protocol (start())
        self._lead: Leader | None = None  # what start() builds on rank 0 (ranks ≠ 0 hold just the actor)
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
        self._ranks = ranks = Ranks.from_env()
        if ranks.rank == 0:
            try:
                self._lead = lead = Leader.start(self.config, self._resume_state, ranks)
            except BaseException:
                self._closed = True  # (Leader.start released what it built)
                raise
            self.tokenizer, self.actor, self.lora_base = lead.tokenizer, lead.actor, lead.lora_base
            self.eval_problems = lead.eval_problems
            self._steps.rows = list(lead.restored.history) if lead.restored is not None else []
        else:  # only the actor; rank 0 restores a checkpoint and sends its state (Ranks.join)
            self.tokenizer, self.actor = ranks.build_replica(self.config)
        self._started = True
        guard.live.add(self)
        try:
            self._ranks.join(self.actor, self._resume_state if self.rank == 0 else None, self.engine)
        except BaseException:
            self.close()
            raise
        self._resume_state = None
        return self

    def close(self) -> None:
        """Stop rollouts, the proxy, the engine and the loop thread. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._started and self._lead is not None:
            self._lead.shutdown()
        guard.live.discard(self)

    # ------------------------------------------------------------------ what it holds
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

    # rank 0's parts (None before start() and on ranks ≠ 0)
    engine = property(lambda self: self._lead.engine if self._lead else None, doc="The inference engine.")
    executor = property(lambda self: self._lead.executor if self._lead else None, doc="Rollout executor.")
    workflow = property(lambda self: self._lead.workflow if self._lead else None, doc="The agent's workflow.")
    data = property(lambda self: self._lead.data if self._lead else None, doc="The training data stream.")

    @property
    def proxy_url(self) -> str:
        """Agents point `base_url` here (+ "/v1")."""
        return self._leader(check_open=True).proxy.url

    @property
    def admin_key(self) -> str:
        return self._leader(check_open=True).proxy.admin_key

    @property
    def app(self) -> Any:
        """The proxy's FastAPI app."""
        return self._leader(check_open=True).proxy.app

    @one_call
    def proxy_caches(self) -> dict[str, Any]:
        """The live InteractionCache of every session currently open in the proxy (training only)."""
        return self._leader().proxy.live_caches()

    @one_call
    def engine_log(self) -> EngineLog:
        """The launched engine servers' log lines (`engine.type: sglang`) as a notebook view;
        the full logs are in `<run_dir>/engine_logs/` (or `engine.launch.log_dir`)."""
        return self._leader().engine_log

    @one_call
    def add_step_callback(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """`fn(stats)` runs after every training step (the dashboard uses this)."""
        self._steps.callbacks.append(fn)

    @property
    def history(self) -> Any:
        """One row of stats per training step, as a pandas DataFrame."""
        return self._steps.frame()

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
        return self._leader().runtime.call(self.arollout(n_prompts))

    async def arollout(self, n_prompts: int | None = None) -> RolloutBatch:
        self._check_open()
        batch = await self._leader().rollout(n_prompts or self.config.rollout.batch_size)
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
        stats, inspected = self._ranks.train_step(self.actor, batch, inspect, self.engine)
        if inspected:
            self.last_inspection = self.actor.last_inspection
        if self._lead is not None:  # rank 0
            self._lead.on_new_version()
        row = history_row(self.step_count, self.version, batch if self.rank == 0 else None, stats)
        self._steps.record(row, self._lead.log_metrics if self._lead is not None else None)
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
        self._check_open()
        batch = self._lead.accepted_batch(self.rollout) if self._lead else None  # (ranks ≠ 0: rank 0's)
        if batch is not None and self.config.actor.dynamic_sampling:
            batch = refill_informative(batch, self.rollout, self.config.actor.dynamic_sampling_max_rounds)
        return self.train_step(batch)

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
            show = self.config.logging.progress if progress is None else progress
            run_loop.lead(self, steps, show=show, leader=self._leader(), still_open=lambda: not self._closed)
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

        The agent runs exactly as in training (same workflow, engine and weights) except that
        every generation is greedy; nothing is trained on and the policy version does not move.
        Returns an `EvalResult` (`reward_mean`, `accuracy`: first call rewarded, `agent_accuracy`:
        some call rewarded, the episodes as `.batch`); `pass_k=k` adds `pass_at_k` and `sampled_accuracy`
        from k episodes a problem at `rollout.temperature`. Only rank 0 evaluates (torchrun)."""
        self._check_open()
        if self.rank != 0:
            return None
        return self._leader().runtime.call(self.aevaluate(n, problems=problems, pass_k=pass_k))

    async def aevaluate(
        self, n: int | None = None, *, problems: list[dict] | None = None, pass_k: int | None = None
    ) -> EvalResult:
        self._check_open()
        return await self._leader().evaluate(n, problems, pass_k, held_out=self.eval_problems)

    # ------------------------------------------------------------------ checkpoints
    @one_call
    def save(self, path: str | Path) -> Path:
        """Model, optimizer, step, version, RNG states, data position, config and history.

        Under torchrun every rank calls it and only rank 0 writes (the replicas are equal); the
        others return when the checkpoint is complete (so they may `Session.load` it next)."""
        self._check_open()
        return rank_writes.save(self, self._ranks, path)

    @one_call
    def save_pretrained(self, path: str | Path, *, merged: bool = True, agent: str | None = None) -> Path:
        """The current policy as a Hugging Face folder that `transformers` loads (weights in
        `model.dtype`, config, generation config, tokenizer with its chat template). With
        `actor.lora`, `merged=False` writes the adapter for `peft.PeftModel.from_pretrained`
        instead (`hf_export.py`). With one adapter per agent (`agents`), `agent` names whose
        policy to write. Under torchrun only rank 0 writes."""
        self._check_open()
        return rank_writes.save_pretrained(self, self._ranks, path, merged=merged, agent=agent)

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

    @one_call
    def run_state(self) -> RunState:
        """The run's progress now, as `save()` records it besides the weights (`run_state.py`): version,
        steps, data position (before rollouts fetched ahead, not trained on), RNGs, history. Rank 0 only."""
        return self._leader().run_state(self._steps.rows)

    # ------------------------------------------------------------------ export
    @one_call
    def export(
        self, path: str | Path, *, checkpoint: bool = True, overwrite: bool = False, **overrides: Any
    ) -> Path:
        """Write a run folder that continues this run as a batch job: config.yaml (every override
        applied), train.py, the agent (its import path, or agent.py with its source taken from
        the notebook cells), requirements.txt, README.md, launch_local.sh (torchrun) and
        job.sbatch (Slurm, `cluster`), and with `checkpoint` the current state, so the job goes on
        from this step; ExportError names what cannot travel. `overrides` change the job's config
        only (`total_steps=200, cluster__nodes=2`). Under torchrun every rank calls it and takes
        part in gathering the weights; rank 0 writes the folder (`rank_writes.py`)."""
        self._check_open()
        config = load_config(self.config, flatten_overrides(overrides)) if overrides else self.config
        return rank_writes.export(self, self._ranks, path, config, checkpoint=checkpoint, overwrite=overwrite)

    # ------------------------------------------------------------------ widgets
    @one_call
    def dashboard(self) -> Any:
        """Live training curves, updated after every step."""
        from areal_nb.widgets import Dashboard

        return Dashboard(self)

    def __repr__(self) -> str:
        status = "closed" if self._closed else ("running" if self._started else "not started")
        url = self._lead.proxy.url if self._lead is not None else None
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

    def _leader(self, check_open: bool = False) -> Leader:
        """Rank 0's parts; a call that needs them elsewhere (another rank, before start()) is refused."""
        if check_open:
            self._check_open()
        if self._lead is None:
            raise CallOrderError(
                "this Session has no engine, proxy or rollouts: they are built by start(), on rank 0 only "
                "(under torchrun the other ranks hold just the actor)"
            )
        return self._lead

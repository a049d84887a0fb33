"""How the Session runs on several ranks (torchrun, WORLD_SIZE > 1; docs/guides/data-parallel.md,
"How the replicas stay equal").

Rank 0 is the whole Session: engine, proxy, rollouts, evaluation, checkpoints, metrics. Every other
rank holds only a replica of the actor and follows rank 0: the same user code runs everywhere
(`Session(config)`, `run(n)` / `train_step(...)`, `save`, `close`), and on ranks ≠ 0 those calls
receive what rank 0 sends instead of doing rank-0 work. Rank 0 sends one message per collective
point, `(kind, payload)`:

- "start": at the end of `start()`: the actor's version and step count, the optimizer state
  (non-empty after `Session.load`), and after `Session.load` under FSDP the KL reference's full
  weights (each rank keeps its shards); the weights follow as tensors (`broadcast_module`);
- "train": per training step, the batch tensors, its credit mode and `inspect`;
- "saved": after rank 0 wrote a checkpoint in `save()` (or a run folder in `export()`), its path (the
  others may load it next);
- "abort": instead of any of these, when rank 0 failed: the other ranks raise `LeaderFailed` with its
  message instead of waiting for the process-group timeout.

`Ranks` is what the Session holds: this process's rank and the steps of that protocol (a replica's
start and joining, each training step with rank 0's batch, rank-0-only writes: `rank_writes.py`).
Rank 0's own parts are its `Leader` (`leader.py`). In one process it is rank 0 of 1 and every step
is local.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_nb.api import CreditMode
from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import (
    ArgumentTypeError,
    CallOrderError,
    LeaderFailed,  # noqa: F401 (re-exported)
)
from areal_nb.train import distributed
from areal_nb.train.distributed import DataParallel

if TYPE_CHECKING:
    from areal_nb.api import InferenceEngine
    from areal_nb.config import SessionConfig
    from areal_nb.rollout.batch import RolloutBatch
    from areal_nb.train import Actor


class Ranks:
    """This process's place under torchrun and the protocol rank 0 leads (module docstring)."""

    def __init__(self, parallel: DataParallel | None) -> None:
        self.parallel = parallel  # None: one process
        self.channel = RankChannel(parallel) if parallel is not None else None
        self.in_train_step = False  # inside the ranks' collective training step (no abort message then)

    @classmethod
    def from_env(cls) -> Ranks:
        return cls(distributed.init_from_env())

    @property
    def rank(self) -> int:
        return 0 if self.parallel is None else self.parallel.rank

    @property
    def world_size(self) -> int:
        return 1 if self.parallel is None else self.parallel.world_size

    def build_replica(self, config: SessionConfig) -> tuple[Any, Actor]:
        """A rank ≠ 0's part of `start()`: the tokenizer and the actor on this rank's device,
        which `join` then sets to rank 0's state."""
        from . import builder

        builder.seed_everything(config.seed)
        tokenizer, policy = builder.build_policy(config)
        return tokenizer, builder.build_actor(config, policy, parallel=self.parallel, tokenizer=tokenizer)

    def abort(self, error: BaseException) -> None:
        """Rank 0 failed where the others wait for its next message: they raise `LeaderFailed`."""
        if self.channel is not None:
            self.channel.abort(error)

    def abort_unless_in_step(self, error: BaseException) -> None:
        """`run()` failed on rank 0: the others wait for the next step's batch, unless the failure
        came inside the collective step itself (there they fail on their own)."""
        if not self.in_train_step:
            self.abort(error)

    def join(self, actor: Actor, resumed: dict[str, Any] | None, engine: InferenceEngine | None) -> None:
        """Every rank starts from rank 0's weights, optimizer state, version and step count.
        `resumed`: rank 0's checkpoint state after `Session.load` (its full optimizer state)."""
        parallel, channel = self.parallel, self.channel
        if parallel is None or channel is None:  # one process (both are set together under torchrun)
            return
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
            actor.push_weights(engine if self.rank == 0 else None)

    def share_batch(self, batch: RolloutBatch | None, inspect: bool) -> StepInput:
        """A training step's input on every rank: rank 0's batch (the others' `batch` is None)."""
        step: StepInput | None = None
        if self.rank == 0:
            if batch is None:
                raise ArgumentTypeError("train_step() needs a RolloutBatch (from rollout()), got None")
            step = StepInput(batch.to_tensors(), batch.credit, inspect, batch.agents)
        if self.channel is not None:
            step = self.channel.send("train", step)  # ranks ≠ 0 receive rank 0's
        assert step is not None, "a rank ≠ 0 runs under torchrun, so with a channel"
        return step

    def train_step(
        self, actor: Actor, batch: RolloutBatch | None, inspect: bool, engine: InferenceEngine | None
    ) -> tuple[dict[str, float], bool]:
        """One training step on every rank (rank 0's `batch`, `share_batch`), the new weights then
        pushed (every rank takes part in FSDP's gathers; rank 0's `engine` gets them). Returns the
        whole batch's stats and whether the step kept its per-token values (rank 0's `inspect`:
        `actor.last_inspection`, its rows tagged with their agents when the batch has several)."""
        step = self.share_batch(batch, inspect)
        if engine is not None:  # its speed-ups go stale with this step's push: their memory is the step's
            engine.drop_caches()
        self.in_train_step = True  # a failure from here on is inside the ranks' collectives
        stats = dict(
            actor.train_step(step.batch, credit=step.credit, inspect=step.inspect, agents=step.agents)
        )
        self.in_train_step = False
        inspection = actor.last_inspection if step.inspect else None
        if inspection is not None and batch is not None and len(batch.agents) > 1:
            inspection.agents = [row.agent for row in batch.rows()]  # to_tensors' order
        actor.push_weights(engine)  # every rank: FSDP gathers the weights
        return stats, step.inspect

    def written_by_rank_0(self, write: Callable[[], str | Path]) -> Path:
        """`write()` on rank 0 and its path on every rank: the others wait for it (a "saved"
        message), or raise rank 0's error when it failed."""
        path: str | Path | None = None
        if self.rank == 0:
            try:
                path = write()
            except BaseException as e:
                self.abort(e)
                raise
        if self.channel is not None:
            path = self.channel.send("saved", str(path) if self.rank == 0 else None)
        assert path is not None, "a rank ≠ 0 runs under torchrun, so with a channel"
        return Path(path)


@dataclass(frozen=True)
class StepInput:
    """What every rank's `Actor.train_step` takes, as rank 0 sends it."""

    batch: TrainBatch
    """Rank 0's `RolloutBatch.to_tensors()`."""
    credit: CreditMode
    """The batch's credit mode (config's actor.credit, or a reexport's: what its views showed)."""
    inspect: bool
    """Keep the update's per-token values (`Session.last_inspection`)."""
    agents: list[str | None]
    """The names the batch's `agent_ids` index."""


class RankChannel:
    """Rank 0's messages to the other ranks, over the data-parallel group."""

    def __init__(self, parallel: DataParallel) -> None:
        self.parallel = parallel

    def send(self, kind: str, payload: Any = None) -> Any:
        """Rank 0: send (kind, payload) and return the payload; other ranks: receive rank 0's
        payload of that kind (`LeaderFailed` when rank 0 sent an abort instead)."""
        got_kind, got = self.parallel.broadcast((kind, _to_cpu(payload)) if self.parallel.is_leader else None)
        if got_kind == "abort":
            raise LeaderFailed(f"rank 0 failed: {got}")
        if got_kind != kind:
            raise CallOrderError(
                f"rank {self.parallel.rank} expected {kind!r} from rank 0 but got {got_kind!r}: "
                "every rank must make the same Session calls in the same order"
            )
        return payload if self.parallel.is_leader else got

    def abort(self, error: BaseException) -> None:
        """Rank 0, at a point where the other ranks wait for a message: tell them it failed."""
        self.parallel.broadcast(("abort", f"{type(error).__name__}: {error}"))


def _to_cpu(obj: Any) -> Any:
    """Tensors travel pickled; on the CPU they unpickle on any rank (not on rank 0's GPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, TrainBatch):
        return obj.to("cpu")
    if isinstance(obj, StepInput):
        return dataclasses.replace(obj, batch=obj.batch.to("cpu"))
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj

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
"""

from __future__ import annotations

from typing import Any

import torch

from areal_nb.errors import LeaderFailed  # noqa: F401 (re-exported)
from areal_nb.train.distributed import DataParallel


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
            raise RuntimeError(
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
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj

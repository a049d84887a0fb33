"""Data-parallel training on `torch.distributed`: the process group, and the few collectives the
Actor needs to make N ranks compute the update one process would compute on the whole batch.

Started by `torchrun` (env RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), every rank
holds a full replica of the policy and its optimizer (DDP's layout). Per optimizer step:

1. every rank has the whole batch (rank 0 broadcasts it) and trains only its share of the rows
   (`shard_rows`: contiguous, balanced by tokens; a rank may get no row at all);
2. each rank's loss is divided by the GLOBAL loss-token count of the minibatch, so the sum of the
   ranks' gradients is the gradient of the whole minibatch's token mean;
3. `all_reduce_grads` sums the gradients (one flat buffer, like DDP's reducer bucket), and every
   rank clips and steps with the same gradient: the replicas stay equal.

Why not `DistributedDataParallel` itself: its reducer needs every rank to run the same number of
backward passes, but with uneven shards a rank can have fewer micro-batches (or none); one explicit
all-reduce after the minibatch's micro-batches gives the same result without dummy passes.

FSDP2 (`actor.parallel: fsdp`, `fully_shard_model`): each decoder layer and the root are sharded
over the ranks, parameters, gradients and Adam state alike (each rank holds 1/N of them); a layer's
full weights are gathered just for its forward/backward, and its gradients reduce-scattered. Those
collectives run inside every forward and backward, so under FSDP every rank runs the same number of
passes (`micro_batches` pads a short share with empty micro-batches: dummy passes of zero loss).
`full_state_dict` gathers full tensors (weight pushes, checkpoints: a collective, every rank calls
it); `shard_like` keeps each rank's own shard of full tensors (no communication).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from areal_nb.errors import InvalidArgumentError, ProcessGroupError

from .microbatch import split_micro_batches

logger = logging.getLogger(__name__)

# How long a rank waits in one collective. Ranks ≠ 0 wait while rank 0 rolls out and evaluates,
# so this bounds the longest rank-0-only stretch; it is the backstop when rank 0 hangs (a rank 0
# that fails sends an abort, and one that dies closes its sockets: both surface at once).
_DEFAULT_TIMEOUT_S = 1800.0
_TIMEOUT_ENV = "AREAL_NB_DIST_TIMEOUT_S"


def _env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_rank() -> int:
    """RANK as torchrun sets it (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


@dataclass
class DataParallel:
    """This process's place in the data-parallel group; `Actor(parallel=...)` uses it."""

    rank: int
    world_size: int
    device: torch.device  # where collectives run: cuda:LOCAL_RANK under NCCL, else cpu

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------ objects from rank 0
    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (pickled; tensors travel on the CPU)."""
        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers rank 0's (the replicas start equal)."""
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                self._broadcast_tensor(tensor)

    def _broadcast_tensor(self, tensor: Tensor) -> None:
        if isinstance(tensor, DTensor):  # FSDP: rank 0's full tensor, scattered as shards
            shard = distribute_tensor(
                tensor.full_tensor(), tensor.device_mesh, tensor.placements, src_data_rank=0
            )
            tensor.to_local().copy_(shard.to_local())
            return
        moved = tensor.data.to(self.device)
        dist.broadcast(moved, src=0)
        if moved is not tensor.data:
            tensor.data.copy_(moved)

    # ------------------------------------------------------------ the training step
    def shard_rows(self, rows: Tensor, lengths: Tensor) -> Tensor:
        """This rank's share of `rows` (indices into the batch): a contiguous run, balanced by
        the rows' token `lengths`. Uneven counts are fine; a rank may get none."""
        return shard_rows(rows, lengths, self.rank, self.world_size)

    def micro_batches(
        self,
        rows: Tensor,
        lengths: Tensor,
        size: int | None,
        same_count: bool = False,
        pack_ids: Tensor | None = None,
        max_tokens: int | None = None,
    ) -> list[Tensor]:
        """This rank's share of `rows` in micro-batches of at most `size` rows (None: any) and
        `max_tokens` tokens (None: any; `microbatch.py`). `same_count`
        (FSDP): padded with empty micro-batches to the most any rank has; every rank computes
        every share (`shard_rows` is deterministic), so no communication is needed. `pack_ids`:
        micro-batches split further to one pack id each (packed: one trie, one forward each)."""

        def split(share: Tensor) -> list[Tensor]:
            micros = split_micro_batches(share, lengths, size, max_tokens)
            if pack_ids is not None:
                micros = [m[pack_ids[m] == g] for m in micros for g in pack_ids[m].unique()]
            return micros

        mine = split(self.shard_rows(rows, lengths))
        if same_count:
            most = max(
                len(split(shard_rows(rows, lengths, r, self.world_size))) for r in range(self.world_size)
            )
            mine += [rows[:0]] * (most - len(mine))
        return mine

    def sum_(self, tensor: Tensor) -> Tensor:
        """In-place sum over ranks (e.g. rows each rank filled in a zero tensor)."""
        moved = tensor.to(self.device)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        if moved is not tensor:
            tensor.copy_(moved)
        return tensor

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks, through one flat buffer. A rank that
        trained no row contributes zeros (its gradients may be None)."""
        params = list(params)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.sum_(flat)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
            offset += n


def fully_shard_model(
    model: torch.nn.Module, frozen: bool = False, compute_dtype: torch.dtype | None = None
) -> None:
    """FSDP2 on a Hugging Face decoder: each layer of `model.model.layers`, then the root
    (embeddings, final norm, head). Gradients are summed, not averaged, over the ranks: the loss
    is already divided by the global token count (as for DDP above).

    `frozen`: a model that only runs no-grad forwards (the KL reference). Every unit, the root
    included, then frees its gathered weights right after its forward: by default FSDP keeps the
    root's gathered for the backward that reshards it, which never comes, so each rank would hold
    the embedding and head whole from the first forward on.

    `compute_dtype` other than float32: mixed precision (`precision.py`): each unit gathers its
    float32 weights cast to it, and gradients are reduce-scattered in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise InvalidArgumentError(
            f"actor.parallel=fsdp shards a decoder's model.layers; {type(model).__name__} has none"
        )
    units = [*layers, model]  # inner units first: the root's unit holds what is left
    mixed = compute_dtype is not None and compute_dtype != torch.float32 and not frozen
    policy = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if mixed
        else MixedPrecisionPolicy()
    )
    for unit in units:
        fully_shard(
            unit, reshard_after_forward=True if frozen else None, mp_policy=policy
        )  # (None: FSDP's default)
    if frozen:  # no gradients to reduce
        return
    for unit in units:  # a plain SUM (gloo has no pre-multiplied sum)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def full_state_dict(state: Any) -> Any:
    """`state` (a state dict, nested dicts allowed) with every DTensor gathered to a full tensor.
    A collective under FSDP: every rank calls it, with the same keys."""
    if isinstance(state, DTensor):
        return state.full_tensor()
    if isinstance(state, dict):
        return {k: full_state_dict(v) for k, v in state.items()}
    return state


def shard_like(full: Any, like: Any) -> Any:
    """`full` cut to this rank's shard where `like` is a DTensor (same nesting; no communication:
    every rank holds the full value)."""
    if isinstance(like, DTensor):
        full = full.to(device=like.device, dtype=like.dtype)
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    if isinstance(like, dict) and isinstance(full, dict):
        return {k: shard_like(v, like[k]) if k in like else v for k, v in full.items()}
    return full


def shard_rows(rows: Tensor, lengths: Tensor, rank: int, world_size: int) -> Tensor:
    """Rank `rank`'s contiguous share of `rows`: a row goes to the rank whose 1/world_size of the
    rows' total tokens holds the row's token midpoint (so long rows are not all on one rank)."""
    if rows.numel() == 0:
        return rows
    tokens = lengths[rows].double().clamp(min=1)
    ends = tokens.cumsum(0)
    owner = ((ends - tokens / 2) * world_size / ends[-1]).floor().clamp(max=world_size - 1).long()
    return rows[owner == rank]


def init_from_env(timeout_s: float | None = None) -> DataParallel | None:
    """The data-parallel group torchrun describes, or None for one process (WORLD_SIZE ≤ 1).

    Reuses a process group the caller already initialised; otherwise creates one (NCCL when this
    process has a GPU, else gloo) with a timeout (`AREAL_NB_DIST_TIMEOUT_S`, default 30 min),
    which lives until the process exits: a script may close one Session and start another.
    """
    world_size = _env_world_size()
    if world_size <= 1:
        return None
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing and not dist.is_initialized():
        raise ProcessGroupError(
            f"WORLD_SIZE={world_size} but {missing} are not set: start the job with torchrun "
            f"(torchrun --nproc-per-node {world_size} train.py)"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # "cuda" now means this rank's GPU (the model goes there)
    if not dist.is_initialized():
        timeout = float(os.environ.get(_TIMEOUT_ENV, timeout_s or _DEFAULT_TIMEOUT_S))
        dist.init_process_group(
            backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout)
        )
        atexit.register(_destroy_group)
        sys.excepthook = _note_failure(sys.excepthook)
        logger.info("rank %d/%d joined the %s process group", dist.get_rank(), world_size, dist.get_backend())
    if dist.get_world_size() != world_size:
        raise ProcessGroupError(
            f"the process group has {dist.get_world_size()} ranks, WORLD_SIZE says {world_size}"
        )
    return DataParallel(rank=dist.get_rank(), world_size=world_size, device=device)


# How long a rank that ends its program normally waits at exit for the others (gloo). A rank whose
# process is torn down while a peer still runs (one rank saves a checkpoint, the other is done)
# can abort in gloo's teardown ("terminate called without an active exception", SIGABRT), and
# torchrun then reports the whole job failed; meeting at exit first avoids it.
EXIT_BARRIER_S = 60.0
_failed: list[BaseException] = []  # an uncaught exception is ending this rank: do not wait at exit


def _note_failure(hook: Any) -> Any:
    def excepthook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        _failed.append(value)
        hook(kind, value, traceback)

    return excepthook


def _destroy_group() -> None:
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo" and not _failed:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_BARRIER_S))
        except RuntimeError as exc:  # a peer failed or is gone: it reported its own error
            logger.warning("ranks did not all reach the end of the program: %s", str(exc).splitlines()[0])
    dist.destroy_process_group()

"""The KL reference model under `actor.parallel=fsdp`: one Actor train step with `kl_ctl > 0` on
ddp_step's fixed batch, per case of `CASES`, then a round-trip of the reference's weights.

`python -m torch.distributed.run --nproc-per-node 2 tests/train/fsdp_ref.py OUT.pt` shards the
policy and the reference over 2 gloo ranks; rank 0 writes each case's reference log-probs (what
the KL penalty used), stats, and what every rank held of the reference to OUT.pt.
`one_process_step(case)` is the same step in one process. Used by tests/train/test_distributed.py.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import areal_nb.train.actor_policies as policies_module
from areal_nb.api.train_batch import TrainBatch
from areal_nb.models import load_model
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.distributed import DataParallel, init_from_env

try:
    from .ddp_step import GROUPS, LR, fixed_batch
except ImportError:  # run as a script by torchrun: this folder is on sys.path
    from ddp_step import GROUPS, LR, fixed_batch

CASES: dict[str, dict] = {
    "packed": {},  # one trie per group and micro-batch
    # one row per micro-batch: rank 0 has 2 rows, rank 1 has 3, so rank 0's reference pass is padded
    "padded_micro": {"pack": False, "micro_batch_size": 1},
}


def build_actor(parallel: DataParallel | None, case: str, ref_scale: float = 0.9) -> Actor:
    torch.manual_seed(0)
    model = load_model("tiny-math", dtype=torch.float32, device="cpu")
    ref = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy: the KL term is not 0
        for p in ref.parameters():
            p.mul_(ref_scale)
    cfg = GRPOConfig(lr=LR, kl_ctl=0.1, parallel="fsdp" if parallel is not None else "ddp", **CASES[case])
    return Actor(model, cfg, ref_model=ref, parallel=parallel)


def train_case(case: str, parallel: DataParallel | None) -> dict:
    actor = build_actor(parallel, case)
    seen: dict[str, torch.Tensor] = {}
    compute_advantages = policies_module.compute_advantages

    def spy(inputs, *args, **kwargs):  # the reference log-probs the KL penalty is computed from
        seen["ref_logprobs"] = inputs["ref_logprobs"].clone()
        return compute_advantages(inputs, *args, **kwargs)

    policies_module.compute_advantages = spy
    try:
        stats = actor.train_step(
            TrainBatch(**fixed_batch(actor.model.config.vocab_size), group_ids=torch.as_tensor(GROUPS))
        )
    finally:
        policies_module.compute_advantages = compute_advantages
    ref_params = list(actor.ref_model.parameters())
    trained = {id(p) for group in actor.optimizer.param_groups for p in group["params"]}
    return {
        "ref_logprobs": seen["ref_logprobs"],
        "stats": stats,
        # after the no-grad passes every reference parameter is its shard again (the root too)
        "ref_all_sharded": all(isinstance(p, DTensor) for p in ref_params) if parallel is not None else None,
        "ref_held_numel": sum(
            p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in ref_params
        ),
        # the memory behind those shards (not views of a full copy that stayed allocated)
        "ref_held_bytes": sum(
            (p.to_local() if isinstance(p, DTensor) else p).untyped_storage().nbytes() for p in ref_params
        ),
        "ref_numel": sum(p.numel() for p in ref_params),
        "ref_requires_grad": any(p.requires_grad for p in ref_params),
        "ref_in_optimizer": any(id(p) in trained for p in ref_params),
        "ref_has_grad": any(p.grad is not None for p in ref_params),
        "ref_weights": actor.ref_weights(),  # (sharded: gathered)
        "actor": actor,
    }


def one_process_step(case: str) -> dict:
    out = train_case(case, None)
    del out["actor"]
    return out


def round_trip(actor: Actor, parallel: DataParallel, folder: Path) -> dict:
    """The reference's full weights saved by rank 0 and loaded by every rank into a fresh sharded
    actor whose own reference is another model (the unscaled policy)."""
    saved = actor.ref_weights()  # every rank: a gather
    if parallel.is_leader:
        torch.save(saved, folder / "ref.pt")
    dist.barrier()
    fresh = build_actor(parallel, "packed", ref_scale=1.0)
    before = fresh.ref_weights()
    fresh.load_ref_weights(torch.load(folder / "ref.pt", weights_only=True))
    after = fresh.ref_weights()
    return {
        "differed_before": any(not torch.equal(before[k], saved[k]) for k in saved),
        "restored_equal": all(torch.equal(after[k], saved[k]) for k in saved)
        and after.keys() == saved.keys(),
    }


def main(out: str) -> None:
    parallel = init_from_env(timeout_s=120)
    assert parallel is not None, "run under torchrun (WORLD_SIZE > 1)"
    results = {case: train_case(case, parallel) for case in CASES}
    results["round_trip"] = round_trip(results["packed"]["actor"], parallel, Path(out).parent)
    for case in CASES:
        del results[case]["actor"]
    results["held_by_rank"] = parallel.all_gather(
        {case: (results[case]["ref_held_numel"], results[case]["ref_held_bytes"]) for case in CASES}
    )
    results["world_size"] = parallel.world_size
    if parallel.is_leader:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])

"""A user's train script, run on every rank by tests/test_distributed_session.py under torchrun:
`Session(config)`, `run(2)`, one explicit `train_step(rollout())`, `save`, `export`, `close`, then
`Session.load` of that checkpoint and one more step. Each rank writes its weights, history and
resumed state to OUT/rank<R>.pt (for the test only).

With a last argument "fail", rank 0's agent fails its first episode in `run()`; with "fsdp" the actor
is sharded (`actor.parallel=fsdp`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from areal_nb.config import load_config
from areal_nb.session import Session

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "logging.progress=false",
    "logging.eval_every=2",
    "data.eval_size=2",
    "total_steps=10",  # the linear lr decay must not reach 0 by the resumed 4th step
    "actor.kl_ctl=0.01",
]  # a KL reference: a full replica under ddp, sharded under fsdp


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def main(out: Path, fail: bool, fsdp: bool) -> None:
    overrides = [
        *SMALL,
        f"actor.parallel={'fsdp' if fsdp else 'ddp'}",
        f"logging.run_dir={out}",
        f"checkpoint.save_dir={out / 'ckpt'}",
        "checkpoint.save_every=2",
    ]
    if fail:  # rows the math agent cannot read: the first-episode check in run() fails, on rank 0 only
        (out / "bad.jsonl").write_text('{"prompt": "no question here"}\n' * 4)
        overrides += [
            f"data.source={out / 'bad.jsonl'}",
            "data.format=rows",
            f"data.eval_source={out / 'bad.jsonl'}",
        ]
    cfg = load_config(CONFIG, overrides)
    with Session(cfg) as session:
        initial_ref = flat(session.actor.ref_weights().values())  # = the initial policy (fsdp: gathered)
        session.run(2)
        session.train_step(session.rollout())
        saved = session.save(out / "final")
        exported = session.export(out / "exported")  # every rank calls it; rank 0 writes the folder
        weights = flat(session.actor.weights().values())  # (fsdp: gathered from the shards)
        # what this rank holds: under fsdp a shard of each parameter (DTensor), else all of it
        held = sum(getattr(p, "_local_tensor", p).numel() for p in session.actor.model.parameters())
        ref_held = sum(getattr(p, "_local_tensor", p).numel() for p in session.actor.ref_model.parameters())
        report = {
            "held_numel": held,
            "weights_numel": sum(p.numel() for p in session.actor.model.parameters()),
            "ref_held_numel": ref_held,
            "initial_ref": initial_ref,
            "rank": session.rank,
            "world_size": session.world_size,
            "weights": weights,
            "history": session.history.to_dict("records"),
            "version": session.version,
            "saved": str(saved),
            "exported": str(exported),
        }
    # resume: rank 0 restores the checkpoint and sends weights and optimizer state to the replicas
    with Session.load(out / "final") as resumed:
        report["resumed_at"] = (resumed.version, resumed.step_count, resumed.actor.steps_done)
        report["resumed_weights_equal"] = torch.equal(weights, flat(resumed.actor.weights().values()))
        # the reference is the run's initial policy, not the saved weights the replicas load first
        report["resumed_ref"] = flat(resumed.actor.ref_weights().values())
        resumed.train_step(resumed.rollout())
        state = resumed.actor.state_dict()
        report["resumed_weights"] = flat(state["model"].values())
        report["resumed_exp_avg"] = flat(s["exp_avg"] for s in state["optimizer"]["state"].values())
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), fail="fail" in sys.argv[2:], fsdp="fsdp" in sys.argv[2:])

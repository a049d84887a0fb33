"""A LoRA run's user script on every rank, run by tests/test_distributed_session.py under torchrun:
two steps, `save`, `save_pretrained` (merged and the adapter alone), then `Session.load` of the
checkpoint and one more step. Each rank writes what it saw to OUT/rank<R>.pt (for the test only).
Mode `agents`: the solver and the checker with one adapter each (`agents`), data-parallel (ddp).

`python -m torch.distributed.run --nproc-per-node 2 tests/ddp_lora_session.py OUT ddp|fsdp|agents`
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from ddp_session import flat  # (torchrun runs this file as a script: its folder is on sys.path)

from areal_nb.config import load_config
from areal_nb.session import Session

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SMALL = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "logging.progress=false",
    "total_steps=10",
    "actor.lr=5e-2",  # adapters that move the policy: an engine left on the base would be seen
    "actor.kl_ctl=0.01",  # the reference: the base with the adapters off
]
ONE_ADAPTER = ["actor.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, up_proj]}"]
AGENT_ADAPTERS = ["agents.solver.lora={r: 4, alpha: 8}", "agents.checker.lora={r: 2, alpha: 8}"]


def main(out: Path, mode: str) -> None:
    agents = mode == "agents"
    config, adapters = ("solver_checker", AGENT_ADAPTERS) if agents else ("multi_turn_math", ONE_ADAPTER)
    parallel = "ddp" if agents else mode
    cfg = load_config(
        CONFIGS / f"{config}.yaml",
        [*SMALL, *adapters, f"actor.parallel={parallel}", f"logging.run_dir={out}"],
    )
    export = {"agent": "solver"} if agents else {}  # (each agent's policy is its own)
    with Session(cfg) as session:
        drift = [session.train_step(session.rollout())["logprob_abs_diff_max"] for _ in range(2)]
        session.save(out / "final")
        session.save_pretrained(out / "hf", **export)  # every rank: FSDP gathers the merged weights
        session.save_pretrained(out / "adapter", merged=False, **export)
        actor = session.actor
        adapters = flat(actor.adapter_weights().values())
        trainable = [p for p in actor.model.parameters() if p.requires_grad]
        report = {
            "rank": session.rank,
            "drift": drift,
            "adapters": adapters,
            "trainable_numel": sum(p.numel() for p in trainable),
            "trainable_held": sum(getattr(p, "_local_tensor", p).numel() for p in trainable),
            "all_adapters": all(".lora_" in n for n, p in actor.model.named_parameters() if p.requires_grad),
            "optimizer_numel": sum(
                getattr(s["exp_avg"], "_local_tensor", s["exp_avg"]).numel()
                for s in actor.optimizer.state.values()
            ),
        }
    with Session.load(out / "final") as resumed:  # rank 0 reads the adapter and sends it to the others
        report["resumed_equal"] = torch.equal(adapters, flat(resumed.actor.adapter_weights().values()))
        report["resumed_drift"] = resumed.train_step(resumed.rollout())["logprob_abs_diff_max"]
        report["resumed_adapters"] = flat(resumed.actor.adapter_weights().values())
    torch.save(report, out / f"rank{report['rank']}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

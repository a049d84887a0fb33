"""Continue the exported run: load config.yaml, build the same Session, resume from checkpoint/
when it is there, train the remaining steps, save.

    python train.py [key=value ...]            one process
    bash launch_local.sh [key=value ...]       torchrun, cluster.nproc_per_node processes
    sbatch job.sbatch [key=value ...]          Slurm (see README.md)

Overrides are dotted keys as for `areal-nb train` (total_steps=50 rollout.batch_size=8). Under
torchrun every rank runs this same file; the Session decides what rank 0 alone does (rollouts,
engine weights, checkpoints).
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py

from areal_nb import Session  # noqa: E402
from areal_nb.config import load_config  # noqa: E402


def main(overrides: list[str]) -> None:
    os.chdir(HERE)  # the paths in config.yaml are relative to this folder
    config = load_config("config.yaml", overrides)
    checkpoint = Path("checkpoint")
    if (checkpoint / "state.pt").exists():
        session = Session.load(checkpoint, config=config)  # weights, optimizer, RNGs, data position, version
    else:
        session = Session(config)
    with session:
        session.run(max(0, config.total_steps - session.step_count))
        session.save(config.run_dir / "final")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    print(f"rank {rank} of {world}: done at step {session.step_count}, policy version {session.version}")


if __name__ == "__main__":  # reward and agent worker processes import this file again: run only once
    main(sys.argv[1:])

"""job.sbatch runs end to end on this machine with `srun` and `scontrol` stubbed: the engine
server comes up (`areal-nb engine-server`, CPU path), the trainer finds it through
`engine.type=remote engine.addresses=...`, trains, pushes weights through the shared
`weights/` folder and saves. A LoRA run's servers start with the LoRA flags and get adapters, not
weights; with one adapter per agent (`agents`), each agent's. (A real Slurm runs the same script
in tests/slurm/, where Slurm can be installed; this test checks the script's own logic everywhere.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.server]

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
NPROC = 2
RUNS = {  # config, its overrides, the LoRA flags the server gets, what the trainer pushes to weights/
    # (remote servers get the trainer's weights once at start: version-0)
    "full": ("multi_turn_math", [], None, ["version-0", "version-1"]),
    "lora": (
        "multi_turn_math",
        ["actor.lora.r=4"],
        "--enable-lora --max-lora-rank 4 --lora-target-modules all --max-loras-per-batch 2",
        ["adapter-1", "version-0"],
    ),
    "agents": (
        "solver_checker",
        ["agents.solver.lora.r=4", "agents.checker.lora.r=2"],
        "--enable-lora --max-lora-rank 4 --lora-target-modules all --max-loras-per-batch 4",
        ["adapter-checker-0", "adapter-checker-1", "adapter-solver-0", "adapter-solver-1", "version-0"],
    ),
}

SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: one host per line
echo "$3" | tr ',' '\\n'
"""
SRUN = """#!/bin/bash
# srun [options] command...: drop the options, honour --output, run the command on this machine
echo "$*" >> "$(dirname "$0")/srun-commands.log"  # what `ps` would show of each step
out=""
while [[ "$1" == -* ]]; do
  case "$1" in --output=*) out="${1#--output=}";; esac
  shift
done
if [ -n "$out" ]; then exec "$@" > "$out" 2>&1; else exec "$@"; fi
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", list(RUNS))
def test_job_sbatch_starts_an_engine_server_and_trains_against_it(tmp_path, kind):
    config, overrides, lora_flags, pushed = RUNS[kind]
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    run = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{stubs}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_nb.cli",
            "export",
            str(CONFIGS / f"{config}.yaml"),
            *overrides,
            "total_steps=1",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "logging.progress=false",
            "experiment_name=sbatch",
            f"cluster.nproc_per_node={NPROC}",
            f"cluster.engine_port={free_port()}",
            f"cluster.rdzv_port={free_port()}",
            "--out",
            str(run),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert export.returncode == 0, export.stderr

    slurm = {"SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(run)}
    job = subprocess.run(
        ["bash", str(run / "job.sbatch")],
        cwd=run,
        env={**env, **slurm},
        capture_output=True,
        text=True,
        timeout=600,
    )
    server_log = next((run / "logs" / "4242").glob("engine-localhost-0.log")).read_text()
    assert job.returncode == 0, job.stderr[-3000:] + server_log[-2000:]
    assert "areal-nb engine-server listening on" in server_log
    assert f"rank 0 of {NPROC}: done at step 1, policy version 1" in job.stdout
    final = run / "runs" / "sbatch" / "final"
    assert (final / "state.pt").exists()
    # the new policy went to the servers through the shared folder (LoRA: the adapters alone)
    assert sorted(p.name for p in (run / "weights").iterdir() if not p.name.startswith(".")) == pushed
    assert "engine-server: stopping" in server_log  # the job stopped its server when the trainer ended
    # The server listened on 0.0.0.0, so it had a key, and the trainer sent it: both read it from
    # $AREAL_NB_API_KEY, neither command line shows it.
    steps = (stubs / "srun-commands.log").read_text().splitlines()
    assert any("engine-server" in line for line in steps) and any("torchrun" in line for line in steps)
    (server,) = [line for line in steps if "engine-server" in line]
    assert (lora_flags in server) if lora_flags else ("--enable-lora" not in server), server
    assert not [line for line in steps if "api-key" in line or "api_key" in line], steps

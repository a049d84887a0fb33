"""job.sbatch's GPU layout, with Slurm, SGLang and torchrun stubbed (no GPU needed): where the
engine servers share the trainer's node (`cluster.infer_nodes` 0), the trainer ranks get the GPUs
after the servers', not cuda:0 beside server 0; on separate inference nodes they get them all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from areal_nb.config import ConfigError, load_config
from areal_nb.export import export_run

pytestmark = pytest.mark.server  # the export imports its result in a fresh interpreter

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
STUBS = {
    "scontrol": 'echo "$3" | tr , "\\n"\n',  # scontrol show hostnames LIST
    "squeue": "true\n",
    "srun": 'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',  # drop the options, run once here
    # the servers' python: -m sglang.launch_server logs its GPUs and waits; -c (the health check) answers
    "python3": ('if [ "$1" = -m ]; then echo "server $*" >> "$LOG"; exec sleep 30; fi\nexit 0\n'),
    "torchrun": 'echo "trainer CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >> "$LOG"\n',
}


def run_job(tmp_path: Path, overrides: dict, visible: str | None) -> list[str]:
    run = export_run(tmp_path / "run", load_config(CONFIG, overrides))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text("#!/bin/bash\n" + body)
        (stubs / name).chmod(0o755)
    log = tmp_path / "steps.log"
    env = {
        **os.environ,
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "LOG": str(log),
        "SLURM_JOB_NODELIST": "n1,n2",
        "SLURM_JOB_ID": "7",
        "SLURM_SUBMIT_DIR": str(run),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible  # as Slurm sets it for the job's GPUs
    job = subprocess.run(["bash", "job.sbatch"], cwd=run, env=env, capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stderr
    return sorted(log.read_text().splitlines())


SHARED = {
    "cluster.nodes": 2,
    "cluster.gpus_per_node": 4,
    "cluster.servers_per_node": 1,
    "engine.launch.tp_size": 2,
    "cluster.nproc_per_node": 2,
}


@pytest.mark.parametrize(("visible", "trainer"), [("4,5,6,7", "6,7"), (None, "2,3")])
def test_trainer_ranks_skip_the_gpus_of_the_servers_on_their_node(tmp_path, visible, trainer):
    steps = run_job(tmp_path, {**SHARED, "cluster.infer_nodes": 0}, visible)
    assert [s for s in steps if s.startswith("trainer")] == [f"trainer CUDA_VISIBLE_DEVICES={trainer}"]
    servers = [s for s in steps if s.startswith("server")]
    assert len(servers) == 1 and "--tp-size 2 --dp-size 1 --base-gpu-id 0" in servers[0]


def test_trainer_nodes_without_servers_keep_every_gpu(tmp_path):
    steps = run_job(tmp_path, {**SHARED, "cluster.infer_nodes": 1}, "0,1,2,3")
    assert [s for s in steps if s.startswith("trainer")] == ["trainer CUDA_VISIBLE_DEVICES=0,1,2,3"]


def test_servers_and_trainer_that_do_not_fit_one_node_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"2 GPU\(s\) and cluster.nproc_per_node \(3\) .* exceed cluster.gpus_per_node \(4\)",
    ):
        load_config(CONFIG, {**SHARED, "cluster.nproc_per_node": 3})


def test_a_job_submitted_without_the_environment_says_so_before_starting_anything(tmp_path):
    run = export_run(tmp_path / "run", load_config(CONFIG))
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("bash", "dirname", "mkdir", "cat", "seq", "cut"):  # a shell, without the run's environment
        (bare / name).symlink_to(shutil.which(name))
    env = {
        "PATH": str(bare),
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_ID": "7",
        "SLURM_SUBMIT_DIR": str(run),
        "PYTHON": shutil.which("python3") or sys.executable,
    }
    job = subprocess.run(
        [str(bare / "bash"), "job.sbatch"], cwd=run, env=env, capture_output=True, text=True, timeout=60
    )
    assert job.returncode == 127 and "job.sbatch: torchrun is not on PATH" in job.stderr, job.stderr
    local = subprocess.run(
        [str(bare / "bash"), "launch_local.sh"], cwd=run, env=env, capture_output=True, text=True, timeout=60
    )
    assert local.returncode == 127 and "launch_local.sh: torchrun is not on PATH" in local.stderr, (
        local.stderr
    )


def test_a_server_holds_tp_size_times_dp_size_gpus(tmp_path):
    layout = {**SHARED, "engine.launch.tp_size": 1, "engine.launch.dp_size": 2, "cluster.infer_nodes": 0}
    steps = run_job(tmp_path, layout, "0,1,2,3")
    assert [s for s in steps if s.startswith("trainer")] == ["trainer CUDA_VISIBLE_DEVICES=2,3"]
    servers = [s for s in steps if s.startswith("server")]
    assert len(servers) == 1 and "--tp-size 1 --dp-size 2 --base-gpu-id 0" in servers[0]


def test_the_old_gpus_per_server_key_names_the_launch_layout():
    with pytest.raises(ConfigError, match=r"cluster.gpus_per_server.*engine.launch.tp_size x dp_size"):
        load_config(CONFIG, {**SHARED, "cluster.gpus_per_server": 4})
    # a file written before the key went, holding the value the launch layout implies, still loads
    assert load_config(CONFIG, {**SHARED, "cluster.gpus_per_server": 2}).engine.launch.gpus_per_server == 2

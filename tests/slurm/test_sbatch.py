"""`sbatch` on a real single-node Slurm (tests/slurm/single_node_slurm.py), as a cluster user would.

1. The harness itself: a two-step job reaches COMPLETED with exit code 0.
2. The exported run folder's `job.sbatch`: its engine server and a 2-process trainer run to
   completion, and the checkpoint is written; a server that cannot start fails the job at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
# Two GRPO steps on tiny batches: the test is about the job running, not about learning.
SHORT = [
    "total_steps=2",
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "data.eval_size=4",
    "logging.progress=false",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _job_report(run_dir: Path, job_id: str) -> str:
    """The job's output and its step logs, for a failure message."""
    parts = []
    for path in [run_dir / f"slurm-{job_id}.out", *sorted((run_dir / "logs").rglob("*.log"))]:
        if path.is_file():
            parts.append(f"--- {path.relative_to(run_dir)}\n{path.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


def _export(run_dir: Path) -> Path:
    """`areal-nb export` (in this process) of the short run, 2 trainer ranks, on free ports."""
    from areal_nb.cli import main as areal_nb

    assert (
        areal_nb(
            [
                "export",
                str(CONFIG),
                *SHORT,
                "experiment_name=on-slurm",
                f"cluster.engine_port={_free_port()}",
                f"cluster.rdzv_port={_free_port()}",
                "--nproc",
                "2",
                "--out",
                str(run_dir),
            ]
        )
        == 0
    )
    return run_dir


def _submit(cluster, run_dir: Path) -> str:
    """`sbatch job.sbatch` from the run folder, as a user who activated this venv would: its
    python, areal-nb and torchrun first on PATH."""
    return cluster.submit(
        run_dir / "job.sbatch",
        cwd=run_dir,
        env={"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
    )


def test_a_batch_job_with_steps_completes(slurm_cluster, tmp_path):
    script = tmp_path / "hello.sbatch"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --job-name=hello
        #SBATCH --output={tmp_path}/hello-%j.out
        #SBATCH --cpus-per-task=2
        srun --ntasks=1 --overlap bash -c 'echo "step on $(hostname) as task $SLURM_PROCID"'
        echo "batch on $SLURM_JOB_NODELIST"
        """)
    )
    job_id = slurm_cluster.submit(script, cwd=tmp_path)
    result = slurm_cluster.wait(job_id, timeout=60)
    output = (tmp_path / f"hello-{job_id}.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), output
    assert "as task 0" in output and "batch on localhost" in output


def test_a_failing_job_reports_failed_with_its_exit_code(slurm_cluster, tmp_path):
    script = tmp_path / "fail.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/fail-%j.out\nexit 3\n")
    result = slurm_cluster.wait(slurm_cluster.submit(script, cwd=tmp_path), timeout=60)
    assert (result.state, result.exit_code) == ("FAILED", "3:0")


def test_sbatch_accepts_job_sbatch_whatever_the_names_and_paths(slurm_cluster, tmp_path):
    """`sbatch --test-only` parses the #SBATCH lines as a submission would: an experiment name
    with spaces and quotes, a partition, a day-long time limit, a folder with spaces."""
    from areal_nb.cli import main as areal_nb

    run_dir = tmp_path / "my runs" / "run 1"
    assert (
        areal_nb(
            [
                "export",
                str(CONFIG),
                'experiment_name=Bob\'s "best" run',
                "cluster.partition=debug",
                "cluster.time=1-00:00:00",
                "--out",
                str(run_dir),
            ]
        )
        == 0
    )
    done = subprocess.run(
        ["sbatch", "--test-only", "job.sbatch"],
        cwd=run_dir,
        env=slurm_cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr


def test_the_exported_job_sbatch_trains_with_an_engine_server_and_two_ranks(slurm_cluster, tmp_path):
    """`areal-nb export` → `sbatch job.sbatch`, unedited: the engine server and a 2-process
    torchrun trainer run as steps of one job, train 2 steps of the tiny model against the server,
    and write the final checkpoint. The folder's path has a space, as home folders often do."""
    run_dir = _export(tmp_path / "my run")
    job_id = _submit(slurm_cluster, run_dir)
    result = slurm_cluster.wait(job_id, timeout=600)
    report = _job_report(run_dir, job_id)
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), report
    output = (run_dir / f"slurm-{job_id}.out").read_text()
    for rank in (0, 1):  # train.py's last line on each rank of the torchrun step
        assert f"rank {rank} of 2: done at step 2, policy version 2" in output, report
    assert (run_dir / "runs" / "on-slurm" / "final" / "state.pt").is_file(), report
    # The engine server was a step of this job, the trainer pushed each new policy to it through
    # the shared weights/ folder, and the job stopped it cleanly when the trainer was done.
    server_log = (run_dir / "logs" / job_id / "engine-localhost-0.log").read_text()
    assert "areal-nb engine-server listening on" in server_log, report
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["version-1", "version-2"], report
    assert "engine-server: stopping" in server_log, report


def test_a_job_whose_engine_server_cannot_start_fails_at_once_and_says_so(slurm_cluster, tmp_path):
    """A server step that exits before it is healthy fails the job (FAILED, exit 1) with a line
    naming the server and its logs, instead of the trainer waiting for it until the time limit."""
    run_dir = _export(tmp_path / "run")
    script = run_dir / "job.sbatch"
    assert 'MODEL="tiny-math"' in script.read_text()  # edited as a user would, to weights that are not there
    script.write_text(script.read_text().replace('MODEL="tiny-math"', f'MODEL="{tmp_path}/no-such-model"'))
    job_id = _submit(slurm_cluster, run_dir)
    result = slurm_cluster.wait(job_id, timeout=600)
    report = _job_report(run_dir, job_id)
    assert (result.state, result.exit_code) == ("FAILED", "1:0"), report
    output = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "exited before it was healthy: see " + str(run_dir / "logs" / job_id) in output, report
    assert "rank 0" not in output and not (run_dir / "runs").exists(), report  # no trainer started

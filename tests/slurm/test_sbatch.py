"""`sbatch` on a real single-node Slurm (tests/slurm/single_node_slurm.py), as a cluster user would.

1. The harness itself: a two-step job reaches COMPLETED with exit code 0.
2. The exported run folder's `job.sbatch`: its engine server and a 2-process trainer run to
   completion, and the checkpoint is written.
"""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.slow


def test_a_batch_job_with_steps_completes(slurm_cluster, tmp_path):
    script = tmp_path / "hello.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --job-name=hello
        #SBATCH --output={tmp_path}/hello-%j.out
        #SBATCH --cpus-per-task=2
        srun --ntasks=1 --overlap bash -c 'echo "step on $(hostname) as task $SLURM_PROCID"'
        echo "batch on $SLURM_JOB_NODELIST"
        """))
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

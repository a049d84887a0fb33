"""The `slurm_cluster` fixture: one real single-node Slurm for the module (single_node_slurm.py).

Without Slurm installed (Debian's `slurm-wlm` and `munge`; `make test` installs them as root with
apt) or without root (slurmd must be root to start job steps), the Slurm tests skip and say why.
In CI (`CI=true`) they fail instead: CI installs the packages, so a missing Slurm is a broken CI.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib (no sys.path changes): make the harness importable.
sys.path.insert(0, str(Path(__file__).parent))

from single_node_slurm import SlurmCluster, missing_programs  # noqa: E402


def _unavailable() -> str | None:
    missing = missing_programs()
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}): "
            "apt-get install slurm-wlm munge (make test does this as root)"
        )
    if os.geteuid() != 0:
        return "the single-node Slurm runs slurmd, which must be root to start job steps"
    return None


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = _unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm test: {reason}", pytrace=False)
        pytest.skip(reason)
    cluster = SlurmCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
        leftovers = cluster.leftover_pids()
        assert not leftovers, f"processes of the test cluster outlived it: {leftovers}"
        shutil.rmtree(cluster.root, ignore_errors=True)

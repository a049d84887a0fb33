"""`areal-nb export CONFIG key=value --out DIR`: the run folder from the shell, its scripts, its
errors (a real CLI subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_nb.config import load_config

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multi_turn_math.yaml"


def areal_nb(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "areal_nb.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_export_writes_a_folder_whose_config_and_scripts_hold_every_override(tmp_path):
    out = tmp_path / "run"
    overrides = [
        "total_steps=7",
        "actor.lr=2e-5",
        "cluster.nodes=3",
        "cluster.infer_nodes=1",
        "cluster.gpus_per_node=8",
        "cluster.servers_per_node=2",
        "engine.launch.tp_size=4",
        "cluster.partition=gpu",
        "cluster.time=02:00:00",
    ]
    # overrides may come before and after the options
    result = areal_nb("export", CONFIG, *overrides[:5], "--nproc", 8, "--out", out, *overrides[5:])
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.yaml",
        "job.sbatch",
        "launch_local.sh",
        "requirements.txt",
        "train.py",
    ]  # no agent.py, no checkpoint
    exported = load_config(out / "config.yaml")  # the normal loader reads it back
    expected = load_config(CONFIG, [*overrides, "cluster.nproc_per_node=8"])
    assert exported.model_dump() == expected.model_dump()

    sbatch = (out / "job.sbatch").read_text()
    for line in (
        "#SBATCH --nodes=3",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=02:00:00",
        "INFER_NODES=1",
        "SERVERS_PER_NODE=2",
        "GPUS_PER_SERVER=4",
        "NPROC_PER_NODE=8",
        "-m sglang.launch_server",
        "torchrun --nnodes",
        "--rdzv-backend=c10d",
    ):
        assert line in sbatch, line
    assert "#SBATCH --account" not in sbatch and "@" not in sbatch.replace("$@", "").replace("[@]", "")
    assert 'NPROC="${NPROC:-8}"' in (out / "launch_local.sh").read_text()
    for script in ("job.sbatch", "launch_local.sh"):
        assert subprocess.run(["bash", "-n", out / script]).returncode == 0, script
        assert os.access(out / script, os.X_OK)
    readme = (out / "README.md").read_text()
    assert "areal-nb export" in readme and "total_steps=7" in readme and "git commit" in readme
    requirements = (out / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("torch==") for line in requirements)
    assert any(line.startswith("areal_nb==") for line in requirements)


def test_a_cpu_job_uses_engine_server_and_drops_unset_sbatch_lines(tmp_path):
    result = areal_nb("export", CONFIG, "--out", tmp_path / "cpu")
    assert result.returncode == 0, result.stderr
    sbatch = (tmp_path / "cpu" / "job.sbatch").read_text()
    assert "GPUS_PER_NODE=0" in sbatch and "areal-nb engine-server" in sbatch
    assert "--gpus-per-node" not in sbatch.split("set -euo")[0] and "#SBATCH --partition" not in sbatch


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rollout.batch_sise=3"], "did you mean 'rollout.batch_size'"),
        (["agent.workflow=no_such_module.Agent"], "does not import in a fresh process"),
        (["cluster.nodes=1", "cluster.infer_nodes=1"], "must leave at least one"),
        (["--nproc", "0"], "cluster.nproc_per_node must be >= 1"),  # not silently the config's value
        (["cluster.time=1 hour"], "is not a Slurm time limit"),  # sbatch would refuse it, later, elsewhere
        (["cluster.time=2:00:00"], "quote it in YAML"),  # YAML's base-60 number 7200
        (["cluster.partition=gpu queue"], "is not a Slurm name"),
        (["data.source=no_such_rows.jsonl"], "data.source 'no_such_rows.jsonl' is not a file"),
    ],
)
def test_bad_input_exits_2_naming_it_and_writes_nothing(tmp_path, args, message):
    result = areal_nb("export", CONFIG, *args, "--out", tmp_path / "run")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []  # not even a half-written folder


def test_an_existing_folder_is_not_overwritten_unless_asked(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    result = areal_nb("export", CONFIG, "--out", tmp_path / "run")
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert (
        areal_nb("export", CONFIG, "--out", tmp_path / "run", "--overwrite").returncode == 2
    )  # not an export
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    assert areal_nb("export", CONFIG, "--out", tmp_path / "new").returncode == 0
    assert (
        areal_nb("export", CONFIG, "total_steps=3", "--out", tmp_path / "new", "--overwrite").returncode == 0
    )
    assert load_config(tmp_path / "new" / "config.yaml").total_steps == 3


def test_an_out_path_that_is_a_file_is_refused_and_kept(tmp_path):
    (tmp_path / "run").write_text("mine")
    result = areal_nb("export", CONFIG, "--out", tmp_path / "run")
    assert result.returncode == 2 and "exists and is not a folder" in result.stderr, result.stderr
    assert (tmp_path / "run").read_text() == "mine"


def test_re_exporting_replaces_the_earlier_export_and_keeps_what_the_job_wrote(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1 + 1 =", "target": "2"}\n')
    run = tmp_path / "run"
    assert areal_nb("export", CONFIG, f"data.source={rows}", "--out", run).returncode == 0
    assert (run / "data" / "train.jsonl").is_file()
    # what a job and its user left there
    (run / "runs" / "multi_turn_math" / "final").mkdir(parents=True)
    (run / "runs" / "multi_turn_math" / "final" / "state.pt").write_text("trained for hours")
    (run / "slurm-7.out").write_text("job log")
    (run / "notes.txt").write_text("mine")
    result = areal_nb("export", CONFIG, "total_steps=3", "--out", run, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert load_config(run / "config.yaml").total_steps == 3
    assert not (run / "data").exists()  # the earlier export's data: the new config does not use it
    assert (run / "runs" / "multi_turn_math" / "final" / "state.pt").read_text() == "trained for hours"
    assert (run / "slurm-7.out").read_text() == "job log" and (run / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folders left


def test_names_and_paths_with_spaces_and_quotes_reach_the_scripts_intact(tmp_path):
    """sbatch reads `#SBATCH` lines itself and splits them at spaces; bash reads the rest."""
    model = tmp_path / "my models" / 'it\'s "$HOME"'
    (model.parent).mkdir()
    out = tmp_path / "my runs" / "run 1"
    result = areal_nb("export", CONFIG, 'experiment_name=my "best" run', f"model.path={model}", "--out", out)
    assert result.returncode == 0, result.stderr
    sbatch = (out / "job.sbatch").read_text()
    assert '#SBATCH --job-name="my _best_ run"' in sbatch
    model_line = next(line for line in sbatch.splitlines() if line.startswith("MODEL="))
    echoed = subprocess.run(
        ["bash", "-c", f'{model_line}\nprintf %s "$MODEL"'], capture_output=True, text=True
    )
    assert echoed.stdout == str(model)
    for script in ("job.sbatch", "launch_local.sh"):
        assert subprocess.run(["bash", "-n", out / script]).returncode == 0, script

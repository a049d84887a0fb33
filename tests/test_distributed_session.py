"""The Session under `torchrun --nproc-per-node 2` (gloo): rank 0 runs the engine, proxy and rollouts,
rank 1 a replica of the actor; the same user script and `areal-nb train` finish on both ranks, and a
failure on rank 0 ends rank 1 with rank 0's message instead of a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "ddp_session.py"
CONFIG = ROOT / "configs" / "multi_turn_math.yaml"


def torchrun(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "AREAL_NB_DIST_TIMEOUT_S": "120"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_run_train_step_save_and_load_on_two_ranks(tmp_path, mode):
    result = torchrun([str(SCRIPT), str(tmp_path), mode], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    leader, replica = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert (leader["rank"], replica["rank"], leader["world_size"]) == (0, 1, 2)
    for r in (leader, replica):  # fsdp: each rank holds about half of every parameter
        held = r["held_numel"] / r["weights_numel"]
        assert held == 1.0 if mode == "ddp" else 0.45 < held < 0.55, (mode, held)
        assert r["ref_held_numel"] == r["held_numel"], mode  # the KL reference is laid out like the policy
    # three data-parallel steps (run(2) + train_step) kept the replicas equal
    assert torch.equal(leader["weights"], replica["weights"])
    assert leader["version"] == replica["version"] == 3
    steps = [[row["step"] for row in r["history"]] for r in (leader, replica)]
    assert steps == [[1, 2, 3], [1, 2, 3]]
    for a, b in zip(leader["history"], replica["history"], strict=True):  # whole-batch stats on both
        assert (a["loss"], a["n_rows"], a["grad_norm"]) == (b["loss"], b["n_rows"], b["grad_norm"])
    # rank 0 alone evaluates (logging.eval_every=2) and writes checkpoints
    assert leader["history"][1]["eval_reward"] == leader["history"][1]["eval_reward"]  # not NaN
    assert (
        "eval_reward" not in replica["history"][1]
        or replica["history"][1]["eval_reward"] != replica["history"][1]["eval_reward"]
    )
    assert (tmp_path / "ckpt" / "step2" / "state.pt").is_file() and (
        tmp_path / "final" / "state.pt"
    ).is_file()
    assert replica["saved"] == str(tmp_path / "final")
    # export on every rank: the weights gathered by all (fsdp: from the shards), the folder written by rank 0
    assert leader["exported"] == replica["exported"] == str(tmp_path / "exported")
    exported = torch.load(tmp_path / "exported" / "checkpoint" / "state.pt", weights_only=False)
    assert exported["version"] == 3 and (tmp_path / "exported" / "train.py").is_file()
    assert torch.equal(
        torch.cat([t.flatten() for t in exported["actor"]["model"].values()]).sort().values,
        leader["weights"].sort().values,
    )
    # Session.load on both ranks: rank 0 restores and sends its weights and Adam state; one more step
    for r in (leader, replica):
        assert r["resumed_at"] == (3, 3, 3) and r["resumed_weights_equal"]
    assert torch.equal(leader["resumed_exp_avg"], replica["resumed_exp_avg"])
    assert torch.equal(leader["resumed_weights"], replica["resumed_weights"])
    assert not torch.equal(leader["resumed_weights"], leader["weights"])
    # the KL reference (actor.kl_ctl) came back as the initial policy on every rank, not the saved one
    for r in (leader, replica):
        assert torch.equal(r["resumed_ref"], leader["initial_ref"]), r["rank"]
    assert not torch.equal(leader["initial_ref"], leader["weights"])


def test_rank_0_failing_ends_rank_1_with_its_message(tmp_path):
    result = torchrun([str(SCRIPT), str(tmp_path), "fail"], tmp_path)
    assert result.returncode != 0
    assert "[rank1]: areal_nb.errors.LeaderFailed: rank 0 failed: FirstEpisodeError" in result.stderr
    assert not (tmp_path / "rank1.pt").exists()


def test_areal_nb_train_under_torchrun(tmp_path):
    args = [
        "-m",
        "areal_nb.cli",
        "train",
        "--config",
        str(CONFIG),
        "total_steps=2",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "data.eval_size=4",
        "logging.progress=false",
        "experiment_name=ddp-run",
    ]
    result = torchrun(args, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = tmp_path / "runs" / "ddp-run"
    assert len((run_dir / "history.csv").read_text().splitlines()) == 3
    assert json.loads((run_dir / "final_eval.json").read_text())["n"] == 4
    assert (run_dir / "final" / "state.pt").is_file()
    assert result.stdout.count("done: ddp-run, 2 steps") == 1  # rank 0 reports; rank 1 only trains


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "agents"])
def test_a_lora_run_trains_saves_and_resumes_on_two_ranks(tmp_path, mode):
    """`agents`: one adapter per agent, data-parallel: each call is still served by its own
    agent's adapter after every push (drift), and the replicas hold the same adapters."""
    result = torchrun([str(ROOT / "tests" / "ddp_lora_session.py"), str(tmp_path), mode], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    leader, replica = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    for r in (leader, replica):
        assert r["all_adapters"], mode  # only the adapters train, and hold Adam state
        held = r["trainable_held"] / r["trainable_numel"]
        assert held == 1.0 if mode != "fsdp" else 0.4 < held < 0.6, (mode, held)
        assert r["optimizer_numel"] == r["trainable_held"], mode
        assert r["resumed_equal"], mode  # fsdp: rank 0 sent the checkpoint's adapter to rank 1
    # the engine on rank 0 sampled from base + ΔW after every push, and after the resume
    assert max(leader["drift"]) < 1e-4 and leader["resumed_drift"] < 1e-4, leader
    assert torch.equal(leader["adapters"], replica["adapters"])
    assert torch.equal(leader["resumed_adapters"], replica["resumed_adapters"])
    assert not torch.equal(leader["resumed_adapters"], leader["adapters"])
    assert not list((tmp_path / "final" / "model").glob("*.safetensors"))  # the adapter, not the base
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

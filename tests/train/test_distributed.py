"""Data-parallel training (`areal_nb/train/distributed.py`): two gloo ranks under torchrun compute
the update one process computes on the whole batch, also when the rows do not split evenly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_nb.train.distributed import init_from_env, shard_rows

from . import ddp_step

ROOT = Path(__file__).resolve().parents[2]


def torchrun(
    args: list[str], tmp_path: Path, nproc: int = 2, timeout: float = 300, group_timeout_s: int = 120
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node N ...` as a subprocess, with this tree's code."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "AREAL_NB_DIST_TIMEOUT_S": str(group_timeout_s),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    return result


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_contiguous_disjoint_and_cover_every_row(world_size):
    rows = torch.arange(5)
    lengths = torch.tensor(ddp_step.LENGTHS)
    shards = [shard_rows(rows, lengths, r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat(shards), rows)  # in order, each row once
    if world_size == 2:  # 41 + 6 | 23 + 5 + 30 tokens: balanced by tokens, not by row count
        assert [s.tolist() for s in shards] == [[0, 1], [2, 3, 4]]


def test_a_rank_may_get_no_row():
    rows, lengths = torch.tensor([3]), torch.tensor([0, 0, 0, 9])
    assert [shard_rows(rows, lengths, r, 2).tolist() for r in range(2)] == [[], [3]]
    assert shard_rows(torch.tensor([], dtype=torch.long), lengths, 0, 2).numel() == 0


def test_one_process_has_no_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_from_env() is None


def test_world_size_without_torchrun_env_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="start the job with torchrun"):
        init_from_env()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_give_the_one_process_step(tmp_path, mode):
    out = tmp_path / f"{mode}.pt"
    result = torchrun([str(Path(ddp_step.__file__)), str(out), mode], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    two = torch.load(out, weights_only=False)
    assert two["world_size"] == 2 and two["replica_max_abs_diff"] == 0.0  # the replicas stay equal
    for case in ddp_step.CASES:
        one = ddp_step.one_process_step(case)
        ranks = two[case]
        moved = max(float((one["after"][k] - one["before"][k]).abs().max()) for k in one["after"])
        weights = max(float((one["after"][k] - ranks["after"][k]).abs().max()) for k in one["after"])
        assert moved > 5e-5, case  # the step did move the weights (lr 1e-4)
        assert weights < 1e-5, case
        # the gradient itself (Adam's first moment after one step is 0.1·g), to float rounding
        g_max = max(float(g.abs().max()) for g in one["exp_avg"])
        g_diff = max(
            float((a - b).abs().max()) for a, b in zip(one["exp_avg"], ranks["exp_avg"], strict=True)
        )
        assert g_diff <= 1e-5 * g_max, case
        # advantages normalised once on the whole batch; stats over the whole batch on rank 0. With
        # the KL penalty they carry the reference's log-probs, to float rounding under fsdp: there
        # the reference is sharded, and its packed passes run one group's trie each, like the policy's
        if mode == "fsdp" and "kl_ref" in one["stats"]:
            torch.testing.assert_close(
                ranks["advantages"],
                one["advantages"],
                atol=1e-6,
                rtol=0,
                msg=lambda m, case=case: f"{case}: {m}",
            )
        else:
            assert torch.equal(one["advantages"], ranks["advantages"]), case
        # inspect=True: every row's per-token loss share, assembled from both ranks
        assert torch.allclose(one["contribution"], ranks["contribution"], atol=1e-5), case
        for key in ("loss", "grad_norm", "clip_frac", "entropy", "reward_mean", "adv_std", "n_tokens"):
            assert ranks["stats"][key] == pytest.approx(one["stats"][key], rel=1e-5, abs=1e-6), (case, key)
        if "kl_ref" in one["stats"]:
            assert ranks["stats"]["kl_ref"] == pytest.approx(one["stats"]["kl_ref"], rel=1e-6)
        assert ranks["trainable"] == one["trainable"], case
        if "lora" in ddp_step.CASES[case]:  # only the adapters train, on every rank and in one process
            assert one["trainable"] and all(".lora_" in n for n in one["trainable"]), case
            assert all(
                ".lora_" in k for k in one["after"] if not torch.equal(one["after"][k], one["before"][k])
            )


@pytest.mark.slow
def test_a_stalled_rank_0_ends_the_job_at_the_group_timeout(tmp_path):
    # rank 0 sleeps 120 s; rank 1's wait ends at the 5 s timeout and torchrun stops the job (the
    # subprocess timeout, 90 s, would fire if rank 0 were left running)
    result = torchrun(
        [str(Path(__file__).with_name("ddp_stall.py"))], tmp_path, timeout=90, group_timeout_s=5
    )
    assert result.returncode != 0
    assert "[rank1]: RuntimeError" in result.stderr and "Timed out waiting 5000ms" in result.stderr


@pytest.mark.slow
def test_ranks_meet_at_the_end_of_the_program_unless_one_failed(tmp_path):
    """A rank torn down while a peer still runs can abort in gloo's teardown (SIGABRT) and fail
    the whole job: a rank that ends normally waits at exit until every rank has ended. A rank that
    ends with an uncaught exception does not wait."""
    script = str(Path(__file__).with_name("ddp_exit.py"))

    def stamp(name):
        path = tmp_path / name
        return float(path.read_text()) if path.exists() else None

    late = torchrun([script, str(tmp_path), "late"], tmp_path, timeout=120)
    assert late.returncode == 0, late.stderr[-3000:]
    # rank 1 reached its end first, but left only after rank 0 reached its own
    assert stamp("end-1") < stamp("end-0") <= stamp("exit-1")

    for name in ("end-0", "end-1", "exit-0", "exit-1"):
        (tmp_path / name).unlink(missing_ok=True)
    failed = torchrun([script, str(tmp_path), "fail"], tmp_path, timeout=120)
    assert failed.returncode != 0 and "rank 1 fails on purpose" in failed.stderr
    end_0 = stamp("end-0")  # None when torchrun stopped rank 0 first
    assert stamp("exit-1") is not None and (end_0 is None or stamp("exit-1") < end_0)


@pytest.mark.slow
def test_fsdp_shards_the_kl_reference_and_keeps_its_log_probs(tmp_path):
    from . import fsdp_ref

    out = tmp_path / "ref.pt"
    result = torchrun([str(Path(fsdp_ref.__file__)), str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    two = torch.load(out, weights_only=False)
    assert two["world_size"] == 2
    for case in fsdp_ref.CASES:
        one, ranks = fsdp_ref.one_process_step(case), two[case]
        # the reference log-probs the KL penalty used, on every token of the batch, and what follows
        assert one["ref_logprobs"].abs().max() > 0.1, case
        torch.testing.assert_close(
            ranks["ref_logprobs"],
            one["ref_logprobs"],
            atol=1e-5,
            rtol=0,
            msg=lambda m, case=case: f"{case}: {m}",
        )
        for key in ("loss", "kl_ref", "grad_norm"):
            assert ranks["stats"][key] == pytest.approx(one["stats"][key], rel=1e-5, abs=1e-6), (case, key)
        assert abs(one["stats"]["kl_ref"]) > 1e-3, case  # the reference differs from the policy
        # each rank holds about half of the reference, resharded after its no-grad passes (the
        # root too), with no gradient and no optimizer state; one process holds all of it
        assert ranks["ref_all_sharded"] and one["ref_held_numel"] == one["ref_numel"] == ranks["ref_numel"]
        held = [by_rank[case][0] for by_rank in two["held_by_rank"]]
        assert sum(held) == ranks["ref_numel"] and all(0.45 < h / ranks["ref_numel"] < 0.55 for h in held), (
            held
        )
        held_bytes = [
            by_rank[case][1] for by_rank in two["held_by_rank"]
        ]  # fp32; shards padded to equal size
        assert all(b <= 4 * (ranks["ref_numel"] // 2 + 4096) for b in held_bytes), (
            held_bytes,
            ranks["ref_numel"],
        )
        for r in (one, ranks):
            assert not (r["ref_requires_grad"] or r["ref_in_optimizer"] or r["ref_has_grad"]), case
        # the step left the reference where it was (gathered from the shards: the one-process weights)
        assert all(torch.equal(ranks["ref_weights"][k], one["ref_weights"][k]) for k in one["ref_weights"]), (
            case
        )
    # saved (gathered on every rank) and loaded into another sharded actor: the same reference
    assert two["round_trip"] == {"differed_before": True, "restored_equal": True}

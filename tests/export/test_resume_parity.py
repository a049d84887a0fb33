"""Resume parity: export after step k, run the folder's train.py for one step, and get the same
step k+1 as continuing in the notebook.

Why exact equality is the right tolerance: the job and the notebook run the same code on the
same process layout (one process, CPU, float32): train.py restores the weights, the AdamW state,
the Python/torch/engine-sampler RNG states and the data position, so it samples the same tokens
at the same policy version and computes the same update, operation for operation; any drift
would be a bug in what the checkpoint carries.

With 2 processes (`launch_local.sh`, torchrun, gloo) rank 0 samples the same batch (exactly:
same weights, same sampler state), and the two ranks' gradient shares are summed in another
order than one process sums them: float32 rounding, so the step's statistics agree to 1e-5
relative and the weights to 1e-5 max abs, the bound of the data-parallel parity test
(tests/train/test_distributed.py), not bit for bit.

Rollouts are explicit and sequential: no prefetch, and one episode at a time
(`max_concurrent_rollouts=1`, `group_size=1`). Concurrent episodes share the engine's one
sampling generator, handing out its draws in decode-batch order, and which requests share a
decode step depends on thread timing; sequential episodes take the draws in a fixed order. A
group of one has no GRPO advantage, so the rewards get a fixed baseline instead
(`reward_norm=null`, `reward_bias=-0.5`): the update is not zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_nb import Session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multi_turn_math.yaml"


LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


@pytest.mark.parametrize(
    "nproc, lora", [(1, None), (2, None), (1, LORA), (2, LORA)], ids=["1", "2", "1-lora", "2-lora"]
)
def test_export_after_step_k_then_one_step_equals_the_notebooks_next_step(tmp_path, nproc, lora):
    """(LoRA: the exported checkpoint holds the adapter and names the base; the job loads both.)"""
    k = 2
    with Session(
        CONFIG,
        actor__lora=lora,
        seed=11,
        total_steps=k + 1,
        experiment_name="parity",
        logging__progress=False,
        rollout__batch_size=3,
        rollout__group_size=1,
        rollout__max_concurrent_rollouts=1,
        rollout__prefetch=False,
        actor__reward_norm=None,
        actor__reward_bias=-0.5,
    ) as notebook:
        for _ in range(k):
            notebook.train_step(notebook.rollout())
        run = notebook.export(tmp_path / "run")
        batch = notebook.rollout()  # step k+1, at the current version
        expected = notebook.train_step(batch)
        assert expected["grad_norm"] > 0
        weights = {name: p.detach().clone() for name, p in notebook.actor.model.state_dict().items()}

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NPROC": str(nproc),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }  # its torchrun
    command = (
        [sys.executable, str(run / "train.py")] if nproc == 1 else ["bash", str(run / "launch_local.sh")]
    )
    result = subprocess.run(
        [*command, "logging.progress=false"], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"rank {nproc - 1} of {nproc}: done at step {k + 1}" in result.stdout

    with Session.load(run / "runs" / "parity" / "final") as job:
        assert (job.step_count, job.version) == (k + 1, k + 1)
        row = job.history.iloc[-1]
        for key in ("reward_mean", "episodes", "generated_tokens"):  # the rollout: exact either way
            assert row[key] == expected[key], key
        for key in ("loss", "grad_norm", "entropy"):
            if nproc == 1:
                assert row[key] == expected[key], key
            else:
                assert row[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        for name, value in job.actor.model.state_dict().items():
            if nproc == 1:
                assert torch.equal(value, weights[name]), name
            else:
                assert (value - weights[name]).abs().max().item() < 1e-5, name
        assert job.data.pos == notebook.data.pos  # the same rows were drawn

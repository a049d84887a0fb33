"""A run folder is moved or copied (to a cluster, back from it): its checkpoint still loads.
(And `session.export(dir, **overrides)` sets the job's config, not the notebook's.)

The checkpoint's config.yaml names its model folder by absolute path; `Session.load` takes the
`model/` folder beside it instead, so neither the export's temporary folder nor a move breaks it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from areal_nb import Session

pytestmark = pytest.mark.server  # Sessions serve their proxy on loopback

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
SMALL = dict(
    total_steps=2,
    logging__progress=False,
    rollout__batch_size=2,
    rollout__group_size=2,
    data__eval_size=4,
    experiment_name="moved",
)


def test_an_exported_checkpoint_loads_after_the_folder_moves(tmp_path):
    with Session(CONFIG, **SMALL) as notebook:
        notebook.train_step(notebook.rollout())
        run = notebook.export(tmp_path / "my runs" / "run", total_steps=5, cluster__nproc_per_node=2)
        weights = {k: v.clone() for k, v in notebook.actor.model.state_dict().items()}
        assert (notebook.config.total_steps, notebook.config.cluster.nproc_per_node) == (
            2,
            1,
        )  # the job's only
    saved = yaml.safe_load((run / "checkpoint" / "config.yaml").read_text())
    assert saved["model"]["path"] == str(run / "checkpoint" / "model")  # not the temporary folder
    job = yaml.safe_load((run / "config.yaml").read_text())
    assert (job["total_steps"], job["cluster"]["nproc_per_node"], saved["total_steps"]) == (5, 2, 5)
    assert 'NPROC="${NPROC:-2}"' in (run / "launch_local.sh").read_text()

    moved = Path(shutil.move(run, tmp_path / "elsewhere"))
    with Session.load(moved / "checkpoint", logging__progress=False) as resumed:
        assert resumed.config.model.path == str((moved / "checkpoint" / "model").resolve())
        assert resumed.step_count == 1 and resumed.version == 1
        loaded = resumed.actor.model.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in weights.items())

"""A LoRA run's checkpoint holds the adapter and its optimizer state and names the base model:
it is adapter-sized, resuming from it gives the step that continuing gives, and a base with
other weights is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.errors import CheckpointError
from areal_nb.session.checkpoint import MANIFEST, adopt_checkpoint, verify_checkpoint

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = dict(
    seed=3,
    logging__progress=False,
    rollout__batch_size=2,
    rollout__group_size=2,
    rollout__prefetch=False,
)
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
STATS = ("loss", "adv_mean", "clip_frac", "approx_kl", "entropy", "grad_norm")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA run saved after one step, and what its next step gave (batch, stats, adapters)."""
    tmp = tmp_path_factory.mktemp("lora")
    with Session(CONFIG, actor__lora=LORA, actor__lr=5e-2, **SMALL) as session:
        session.train_step(session.rollout())
        checkpoint = session.save(tmp / "ckpt")
        batch = session.rollout()
        stats = session.train_step(batch)
        adapters = {k: v.clone() for k, v in session.actor.state_dict()["model"].items()}
        base = session.lora_base
    return checkpoint, batch, stats, adapters, base


def test_a_lora_checkpoint_is_adapter_sized(lora_run, tmp_path):
    checkpoint, *_, base = lora_run
    with Session(CONFIG, **SMALL) as full_run:  # the same model trained in full, saved at once
        full = full_run.save(tmp_path / "full")
    assert not list((checkpoint / "model").glob("*.safetensors"))  # no copy of the base
    state = verify_checkpoint(checkpoint)
    assert state["actor"]["model"] and all(".lora_" in k for k in state["actor"]["model"])
    assert json.loads((checkpoint / "base_model.json").read_text())["sha256"] == base["sha256"]
    lora_bytes, full_bytes = folder_bytes(checkpoint), folder_bytes(full)
    assert lora_bytes < full_bytes / 10, (lora_bytes, full_bytes)


def test_resuming_a_lora_checkpoint_gives_the_step_continuing_gave(lora_run):
    checkpoint, batch, stats, adapters, _ = lora_run
    with Session.load(checkpoint) as resumed:
        assert (resumed.step_count, resumed.version, resumed.actor.lora) == (1, 1, True)
        again = resumed.train_step(batch)
        for key in STATS:
            assert again[key] == pytest.approx(stats[key], rel=1e-5, abs=1e-6), key
        for name, value in resumed.actor.state_dict()["model"].items():
            torch.testing.assert_close(value, adapters[name])
        # the engine serves the frozen base and the loaded adapter tensors in place (no merged
        # copy): what it records is the trainer's base + adapter
        assert resumed.engine.shares_weights and resumed.actor.in_place_engine is resumed.engine
        assert resumed.train_step(resumed.rollout())["logprob_abs_diff_max"] < 1e-4


def test_a_base_with_other_weights_is_refused(lora_run, tmp_path):
    from areal_nb.models import load_model, load_tokenizer

    checkpoint = lora_run[0]
    other = load_model("tiny-math")
    with torch.no_grad():
        other.model.norm.weight.add_(1e-3)  # one tensor changed: same names, same shapes
    other.save_pretrained(tmp_path / "other")
    load_tokenizer("tiny-math").save_pretrained(tmp_path / "other")
    with pytest.raises(CheckpointError, match="adapter was trained on the base model 'tiny-math'"):
        Session.load(checkpoint, model__path=str(tmp_path / "other"))
    with pytest.raises(CheckpointError, match="holds a LoRA adapter.*no actor.lora"):
        Session.load(checkpoint, actor__lora=None)


def test_adopting_a_lora_checkpoint_checks_the_adapter_against_the_model(lora_run, tmp_path):
    copy = Path(shutil.copytree(lora_run[0], tmp_path / "copy"))
    (copy / MANIFEST).unlink()
    adopt_checkpoint(copy)  # the structural checks pass on an adapter-only checkpoint
    config = json.loads((copy / "model" / "config.json").read_text())
    (copy / MANIFEST).unlink()
    (copy / "model" / "config.json").write_text(
        json.dumps({**config, "hidden_size": config["hidden_size"] * 2})
    )
    with pytest.raises(CheckpointError, match="adapter .* does not fit"):
        adopt_checkpoint(copy)

"""`write_weights`: atomic version directories that a server can load (save_pretrained or a state dict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_nb.engine.weight_sync import write_weights
from areal_nb.engine.weights import read_weights_dir


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def _hidden_entries(root):
    return [p.name for p in root.iterdir() if p.name.startswith(".")]


def test_a_model_is_written_with_save_pretrained_and_reads_back_exactly(model, tmp_path):
    path = write_weights(tmp_path, 3, model)
    assert path == tmp_path / "version-3"
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen2"
    state = read_weights_dir(path)
    own = model.state_dict()
    assert all(torch.equal(state[k], own[k]) for k in state)
    assert _hidden_entries(tmp_path) == []  # the temporary directory was renamed, nothing left over


def test_a_state_dict_with_tied_weights_is_written_with_the_config_copied(model, tiny_model_path, tmp_path):
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # tied
    path = write_weights(tmp_path, 1, state, config_source=tiny_model_path)
    back = read_weights_dir(path)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    assert (path / "config.json").read_text() == (Path(tiny_model_path) / "config.json").read_text()


def test_rewriting_a_version_replaces_it_and_old_versions_are_pruned(model, tmp_path):
    first = write_weights(tmp_path, 1, {"w": torch.zeros(2)}, keep=2)
    write_weights(tmp_path, 1, {"w": torch.ones(2)}, keep=2)
    assert torch.equal(read_weights_dir(first)["w"], torch.ones(2))
    for v in (2, 3, 4):
        write_weights(tmp_path, v, {"w": torch.full((2,), float(v))}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["version-3", "version-4"]


def test_a_failed_write_leaves_no_partial_directory(tmp_path):
    with pytest.raises(TypeError, match="PreTrainedModel or a state dict"):
        write_weights(tmp_path, 5, [1, 2, 3])
    assert list(tmp_path.iterdir()) == []

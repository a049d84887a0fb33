"""Name resolution, the build cache, and a deterministic (shortened) warm-start build."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from areal_nb.models import load_tokenizer, resolve_model_path, shipped
from areal_nb.models.cache import cached_build, recipe_hash
from areal_nb.models.registry import tiny_math_tokenizer_dir
from areal_nb.models.warm_start import SFT_RECIPE, build_model, new_model, sft_batches


def test_local_folders_and_hub_ids_resolve_as_given(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ValueError, match="model name or path"):
        resolve_model_path("")


def test_loading_the_tokenizer_does_not_build_the_model(monkeypatch, tmp_path):
    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path))
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "nothing-shipped")  # the build-on-first-use path
    tok = load_tokenizer("tiny-math")
    assert tok.eos_token == "<|im_end|>"
    built = sorted(p.name.split("-")[0] for p in (tmp_path / "tiny-math").iterdir() if p.is_dir())
    assert built == ["tokenizer"]


def test_recipe_hash_changes_with_the_recipe_and_the_code(tmp_path):
    src = tmp_path / "recipe.py"
    src.write_text("A = 1\n")
    base = recipe_hash({"steps": 1}, [src])
    assert recipe_hash({"steps": 1}, [src]) == base
    assert recipe_hash({"steps": 2}, [src]) != base
    src.write_text("A = 2\n")
    assert recipe_hash({"steps": 1}, [src]) != base


def test_comments_docstrings_and_layout_do_not_change_the_recipe_hash(tmp_path):
    src = tmp_path / "recipe.py"
    src.write_text('"""The recipe."""\n\ndef lr(step):\n    return 1e-3 * min(1, step / 10)\n')
    base = recipe_hash({"steps": 1}, [src])
    src.write_text(
        '"""The recipe, reworded."""\n\n\ndef lr(step):  # warm-up\n'
        '    """Linear warm-up."""\n    return 1e-3 * min(\n        1, step / 10\n    )\n'
    )
    assert recipe_hash({"steps": 1}, [src]) == base
    src.write_text('"""The recipe."""\n\ndef lr(step):\n    return 1e-3 * min(1, step / 20)\n')
    assert recipe_hash({"steps": 1}, [src]) != base


def test_attribute_docstrings_do_not_change_the_recipe_hash(tmp_path):
    src = tmp_path / "recipe.py"
    src.write_text('class Task:\n    low: int = 0\n    high: int = 9\n\nLABEL = "sum"\n')
    base = recipe_hash({"steps": 1}, [src])
    src.write_text(
        'class Task:\n    """The knobs."""\n\n    low: int = 0\n    """The smallest operand."""\n'
        '    high: int = 9\n    """The largest operand."""\n\nLABEL = "sum"\n"""What the task is called."""\n'
    )
    assert recipe_hash({"steps": 1}, [src]) == base
    src.write_text('class Task:\n    low: int = 0\n    high: int = 9\n\nLABEL = "product"\n')
    assert recipe_hash({"steps": 1}, [src]) != base  # a string that is a value still counts


def test_concurrent_builders_build_once_and_publish_atomically(tmp_path):
    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "half").write_text("x")
        time.sleep(0.2)  # a second builder arrives while this one is still writing
        (tmp / "done").write_text("y")

    final = tmp_path / "artifact"
    results = []
    threads = [threading.Thread(target=lambda: results.append(cached_build(final, build))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [final] * 3
    assert len(calls) == 1
    assert sorted(p.name for p in final.iterdir()) == ["done", "half"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "artifact.lock"]


def test_leftovers_of_a_killed_builder_are_removed(tmp_path):
    (tmp_path / "artifact.tmp-killed").mkdir()
    (tmp_path / "artifact.tmp-killed" / "partial").write_text("x")
    cached_build(tmp_path / "artifact", lambda tmp: (tmp / "done").write_text("y"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact", "artifact.lock"]
    assert [p.name for p in (tmp_path / "artifact").iterdir()] == ["done"]


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def build(tmp):
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cached_build(tmp_path / "artifact", build)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact.lock"]


def test_sft_data_masks_prompts_and_keeps_the_eos(tiny_tokenizer):
    recipe = dict(SFT_RECIPE, steps=5)
    batches = sft_batches(tiny_tokenizer, recipe)
    assert [len(b) for b in batches] == [32, 32, 32, 32, 8]
    assert batches == sft_batches(tiny_tokenizer, recipe)  # deterministic order and content
    ids, labels = batches[0][0]
    trained = [t for t in labels if t != -100]
    assert tiny_tokenizer.decode(trained) == tiny_tokenizer.decode(ids[-len(trained) :])
    assert trained[-1] == tiny_tokenizer.eos_token_id and trained.count(2) == 1
    assert labels[: len(ids) - len(trained)] == [-100] * (len(ids) - len(trained))
    # Two-turn examples train only the corrected second answer.
    ids, labels = batches[4][0]
    trained = [t for t in labels if t != -100]
    assert ids.count(tiny_tokenizer.eos_token_id) == 4 and trained.count(2) == 1
    assert "Your answer is either wrong" in tiny_tokenizer.decode(ids)


def test_model_init_is_deterministic_by_seed(tiny_tokenizer):
    torch.manual_seed(0)
    a = new_model(tiny_tokenizer)
    torch.manual_seed(0)
    b = new_model(tiny_tokenizer)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_short_build_is_deterministic_and_complete(tmp_path):
    recipe = dict(SFT_RECIPE, steps=3, eval_problems=4)
    tokenizer_dir = tiny_math_tokenizer_dir()
    info_a = build_model(tmp_path / "a", tokenizer_dir, recipe)
    info_b = build_model(tmp_path / "b", tokenizer_dir, recipe)
    for name in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "build_info.json",
        "generation_config.json",
        "chat_template.jinja",
    ]:
        assert (tmp_path / "a" / name).is_file(), name
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()
    assert info_a["final_loss"] == info_b["final_loss"]
    assert json.loads((tmp_path / "a" / "build_info.json").read_text())["recipe"] == recipe

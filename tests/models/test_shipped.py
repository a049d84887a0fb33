"""The built-in models come shipped: the same weights on every machine, and stale files fail here.

`WEIGHTS_SHA256` is the hash `areal-nb build-models` printed when it built the shipped files.
After an edit of a recipe, a data generator or a builder, `test_shipped_files_match_the_current_recipe`
fails until they are rebuilt (`areal-nb build-models`, then commit the files and the new hash
below: the weights, so the figures measured on them, have changed), or, for a refactor that builds
the same bits, re-keyed by `python benchmarks/same_bits.py --rekey` (`models/shipped.py`).
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

from areal_nb.models import (
    TINY_MATH,
    TINY_TOOLS,
    load_model,
    load_tokenizer,
    registry,
    resolve_model_path,
    shipped,
)
from areal_nb.models.shipped import recorded_info, shipped_root, weights_sha256

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS_SHA256 = {
    TINY_MATH: "6761ab4035677b42d271db97505cd388b18120e4f3621e31f2eb670cab7407eb",
    TINY_TOOLS: "2d67d7d67f17e00e6bda7e8e401cd2c3d198c7d954882d7d3056ed3fbb57e850",
}


@pytest.mark.parametrize("name", [TINY_MATH, TINY_TOOLS])
def test_shipped_files_match_the_current_recipe(name):
    info = recorded_info(name)
    assert info is not None, f"nothing shipped for {name} in {shipped_root()}: run `areal-nb build-models`"
    assert info["recipe_key"] == registry.recipe_key(name), (
        f"the shipped {name} was built from another recipe or builder code than this checkout's: "
        f"run `areal-nb build-models {name}`, commit areal_nb/models/shipped/{name}/ and put the "
        f"printed weights hash into WEIGHTS_SHA256 of {__file__}; or, if the change builds the same "
        "bits, re-key them with `python benchmarks/same_bits.py --base <commit> --rekey`"
    )


@pytest.mark.parametrize("name", [TINY_MATH, TINY_TOOLS])
def test_the_loaded_weights_are_the_recorded_ones(name):
    # Resolving the name builds nothing: it is the shipped folder.
    assert Path(resolve_model_path(name)) == shipped_root() / name
    digest = weights_sha256(load_model(name))
    assert digest == recorded_info(name)["weights_sha256"] == WEIGHTS_SHA256[name]


def test_the_tokenizers_are_the_shipped_ones(monkeypatch, tmp_path):
    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path))
    for name in (TINY_MATH, TINY_TOOLS):
        tokenizer = load_tokenizer(name)
        assert tokenizer.name_or_path == str(shipped_root() / name)
    assert not any(tmp_path.iterdir())  # nothing built, nothing cached


def test_the_package_data_carries_every_shipped_file():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["areal_nb.models"]
    package = ROOT / "areal_nb" / "models"
    files = [p.relative_to(package).as_posix() for p in shipped_root().rglob("*") if p.is_file()]
    assert len(files) >= 2 * 6
    missed = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert missed == []
    # small enough to ship in the package (float32 safetensors of ~1.1 M parameters each)
    assert sum((package / f).stat().st_size for f in files) < 12 * 2**20


def test_a_stale_shipped_folder_is_not_used(monkeypatch, tmp_path, capsys):
    fake_root = tmp_path / "shipped"
    (fake_root / TINY_MATH).mkdir(parents=True)
    info = recorded_info(TINY_MATH) | {"recipe_key": "0123456789abcdef"}
    (fake_root / TINY_MATH / "build_info.json").write_text(json.dumps(info))
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", fake_root)
    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path / "cache"))

    tokenizer_dir = registry.tiny_math_tokenizer_dir()  # built from the recipe (under a second)

    assert tokenizer_dir.parent == tmp_path / "cache" / TINY_MATH
    assert (tokenizer_dir / "tokenizer.json").is_file()
    said = capsys.readouterr().err
    assert "the shipped tiny-math was built from another recipe" in said and "areal-nb build-models" in said
    # the same tokenizer the shipped folder carries
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", ROOT / "areal_nb" / "models" / "shipped")
    assert (tokenizer_dir / "tokenizer.json").read_text() == (
        shipped_root() / TINY_MATH / "tokenizer.json"
    ).read_text()


@pytest.mark.slow  # trains (2 steps per model)
def test_build_models_writes_complete_folders_and_check_compares_them(monkeypatch, tmp_path, capsys):
    """`areal-nb build-models --out` then `--check`, with the recipes cut to 2 steps (the real
    ones take minutes): the folders load, record the current recipe key and their weights' hash."""
    from areal_nb.cli.build_models import main
    from areal_nb.models import tiny_tools, warm_start

    short_math, short_tools = warm_start.build_model, tiny_tools.build_tools_model
    monkeypatch.setattr(
        warm_start,
        "build_model",
        lambda out, tok: short_math(out, tok, dict(warm_start.SFT_RECIPE, steps=2, eval_problems=2)),
    )
    monkeypatch.setattr(
        tiny_tools,
        "build_tools_model",
        lambda out, tok: short_tools(out, tok, dict(tiny_tools.TOOLS_SFT_RECIPE, steps=2, eval_problems=2)),
    )

    assert main(["--out", str(tmp_path)]) == 0
    for name in (TINY_MATH, TINY_TOOLS):
        info = json.loads((tmp_path / name / "build_info.json").read_text())
        assert info["recipe_key"] == registry.recipe_key(name)
        assert info["weights_sha256"] == weights_sha256(load_model(str(tmp_path / name)))
        assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {
            p.name for p in (tmp_path / name).iterdir()
        }
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    capsys.readouterr()

    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path)  # the 2-step builds as the shipped ones
    assert main(["--check", TINY_MATH]) == 0  # rebuilt on the same machine: the same weights
    assert ": same" in capsys.readouterr().out
    info_path = tmp_path / TINY_MATH / "build_info.json"
    info_path.write_text(json.dumps(json.loads(info_path.read_text()) | {"weights_sha256": "0" * 64}))
    assert main(["--check", TINY_MATH]) == 1
    assert ": DIFFERENT" in capsys.readouterr().out

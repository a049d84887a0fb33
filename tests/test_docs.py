"""The README stays a README, and the documentation site builds with nothing broken.

The README is the pitch, the two commands, the tour, the tutorials and where to go next; the rest
lives on the site under docs/ (mkdocs.yml). `mkdocs build --strict` fails on a broken link or
anchor, a page missing from the navigation and an API reference (mkdocstrings) that does not
resolve, so CI (`make test`) catches them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 12 * 1024  # bytes
DESIGN_LIMIT = 20 * 1024  # docs/design.md is the map; the detail lives in the pages it links


def test_readme_is_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes, more than {README_LIMIT}: move the detail to a page under docs/"
    )


def test_design_is_a_map():
    size = len((ROOT / "docs" / "design.md").read_bytes())
    assert size <= DESIGN_LIMIT, (
        f"docs/design.md is {size} bytes, more than {DESIGN_LIMIT}: move the detail to the page that owns it"
    )


def test_readme_keeps_the_two_commands_true():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "test-fast", "docs"):
        assert f"make {target}" in readme
        assert re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE), (
            f"the Makefile has no `{target}` target"
        )
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)", readme)
    assert targets, "the README links to the docs"
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"


def _nav_paths(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_paths(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_paths(value)]
    return []


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = ROOT / config.get("docs_dir", "docs")
    nav = _nav_paths(config["nav"])
    missing_files = [p for p in nav if not (docs / p).is_file()]
    assert not missing_files, f"the navigation names pages that do not exist: {missing_files}"
    pages = {
        p.relative_to(docs).as_posix()
        for pattern in ("**/*.md", "**/*.ipynb")
        for p in docs.glob(pattern)
        if ".ipynb_checkpoints" not in p.parts
    }
    # docs/tutorials and docs/notebooks link to the notebooks at the top of the repository.
    for folder in ("tutorials", "notebooks"):
        pages |= {f"{folder}/{p.name}" for p in (ROOT / folder).glob("*.ipynb")}
    unreachable = sorted(pages - set(nav))
    assert not unreachable, f"pages not reachable from the navigation of mkdocs.yml: {unreachable}"


def test_the_api_reference_lists_the_public_names():
    api = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference" / "api").glob("*.md"))
    for name in (
        "Session",
        "RolloutBatch",
        "ArealOpenAI",
        "InteractionWithTokenLogpReward",
        "show_tree",
        "show_tokens",
        "show_rewards",
        "show_loss",
        "Dashboard",
        "SessionConfig",
        "EngineConfig",
        "AgentConfig",
        "RolloutConfig",
        "GRPOConfig",
        "DataConfig",
        "ClusterConfig",
    ):
        assert re.search(rf"^::: \S*\.{name}$", api, re.MULTILINE), (
            f"the API reference has no `::: ...{name}`"
        )


def _config_sections() -> list[type]:
    """Every section of the config tree, from `SessionConfig` down: its pydantic models and the
    dataclasses of lower layers it holds (`actor`, `actor.lora`, `data.task`, ...)."""
    import dataclasses
    import typing

    from pydantic import BaseModel

    from areal_nb.config import SessionConfig

    def field_types(cls: type) -> list[Any]:
        if issubclass(cls, BaseModel):
            return [f.annotation for f in cls.model_fields.values()]
        return list(typing.get_type_hints(cls).values())

    def classes(tp: Any) -> list[type]:
        if isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp)):
            return [tp]
        return [c for arg in typing.get_args(tp) for c in classes(arg)]

    found: list[type] = []
    todo: list[type] = [SessionConfig]
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo += [c for tp in field_types(cls) for c in classes(tp)]
    return found


def test_the_api_reference_describes_every_config_key():
    """Each section of the config tree has its page entry, and each of its keys a description the
    reference renders (an attribute docstring, read as mkdocstrings reads it: with griffe)."""
    import dataclasses

    import griffe

    sections = _config_sections()
    assert {c.__name__ for c in sections} >= {"SessionConfig", "GRPOConfig", "LoraConfig", "TaskConfig"}
    page = (ROOT / "docs" / "reference" / "api" / "config.md").read_text()
    documented = dict(re.findall(r"^::: (\S*\.(\w+))$", page, re.MULTILINE))
    documented = {name: path for path, name in documented.items()}
    missing_sections = [c.__name__ for c in sections if c.__name__ not in documented]
    assert not missing_sections, f"docs/reference/api/config.md has no `::: ...` for {missing_sections}"
    # the package once (griffe loads a package whole, whichever module of it is asked for)
    package = griffe.GriffeLoader(search_paths=[str(ROOT)]).load("areal_nb")
    undescribed = []
    for cls in sections:
        path = documented[cls.__name__]
        obj = package[path.removeprefix("areal_nb.")]
        keys = cls.model_fields if hasattr(cls, "model_fields") else [f.name for f in dataclasses.fields(cls)]
        assert obj.docstring is not None, f"{path} has no docstring"
        for key in keys:
            member = obj.members.get(key)
            if member is None or member.docstring is None or not member.docstring.value.strip():
                undescribed.append(f"{cls.__name__}.{key}")
    assert not undescribed, f"config keys without a description (a docstring under the field): {undescribed}"


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for page in (
        "index.html",
        "reference/api/session/index.html",
        "tutorials/01_what_the_proxy_records/index.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page
    # The docstrings were rendered: the Session page lists its methods with their signatures.
    session_page = re.sub(
        r"<[^>]+>", "", (tmp_path / "site" / "reference/api/session/index.html").read_text()
    )
    for method in ("rollout(", "train_step(", "evaluate(", "export("):
        assert method in session_page, method
    # ... and the config page each key with its description and default.
    config_page = re.sub(r"<[^>]+>", "", (tmp_path / "site" / "reference/api/config/index.html").read_text())
    assert "Prompts per training step." in config_page
    assert "batch_size: int = Field(16, ge=1)" in config_page.replace("\n", "")

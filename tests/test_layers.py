"""The layer table of docs/design.md §2, as import-linter contracts (pyproject.toml), holds.

The second test is the proof that the contracts bite: a copy of the package with one forbidden
import added must fail them, naming the contract and the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH=root so the package analysed is the one under `root`, not an installed copy.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_package_keeps_every_layer_contract():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, f"import-linter contracts broken:\n{result.stdout}\n{result.stderr}"
    assert "0 broken" in result.stdout


# (module, the import added to it, the contract that must break, import-linter's words for it)
FORBIDDEN_IMPORTS = [
    # a lower layer importing an upper one
    (
        "capture/cache.py",
        "areal_nb.widgets",
        "areal_nb layers",
        "areal_nb.capture is not allowed to import areal_nb.widgets",
    ),
    # an allowed direction by order, but not in the table's "may import" column
    (
        "proxy/app.py",
        "areal_nb.engine",
        "proxy and rollout reach the engine only through",
        "areal_nb.proxy is not allowed to import areal_nb.engine",
    ),
    # the error tree sits below everything: it imports nothing of areal_nb
    (
        "errors/__init__.py",
        "areal_nb.api",
        "areal_nb layers",
        "areal_nb.errors is not allowed to import areal_nb.api",
    ),
    # product code importing the test helpers
    (
        "config/__init__.py",
        "areal_nb.testing",
        "the product never imports areal_nb.testing",
        "areal_nb.config is not allowed to import areal_nb.testing",
    ),
    # AReaL's import path is for users only
    (
        "cli/proxy.py",
        "areal_nb.openai",
        "areal_nb.openai is AReaL's import path",
        "areal_nb.cli is not allowed to import areal_nb.openai",
    ),
]


def test_each_forbidden_import_breaks_its_contract(tmp_path):
    """One copy of the package with every forbidden import added (one lint-imports run): each is
    reported under the contract that forbids it."""
    shutil.copytree(ROOT / "areal_nb", tmp_path / "areal_nb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, forbidden, _, _ in FORBIDDEN_IMPORTS:
        target = tmp_path / "areal_nb" / module
        target.write_text(target.read_text() + f"\nimport {forbidden}  # the forbidden import\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[-1]
    headers = sorted({broken.index(contract) for _, _, contract, _ in FORBIDDEN_IMPORTS} | {len(broken)})
    for _, _, contract, message in FORBIDDEN_IMPORTS:
        start = broken.index(contract)
        section = broken[start : next(h for h in headers if h > start)]
        assert message in section, f"{message!r} not under {contract!r}:\n{result.stdout}"

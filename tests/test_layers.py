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

import pytest

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


@pytest.mark.parametrize(
    ("module", "forbidden", "contract", "message"),
    [
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
            "errors.py",
            "areal_nb.api",
            "areal_nb layers",
            "areal_nb.errors is not allowed to import areal_nb.api",
        ),
        # product code importing the test helpers
        (
            "config.py",
            "areal_nb.testing",
            "the product never imports areal_nb.testing",
            "areal_nb.config is not allowed to import areal_nb.testing",
        ),
    ],
)
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, forbidden, contract, message):
    shutil.copytree(ROOT / "areal_nb", tmp_path / "areal_nb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "areal_nb" / module
    target.write_text(target.read_text() + f"\nimport {forbidden}  # the forbidden import\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and message in broken, result.stdout

"""SGLang's own code, from its wheel, for the `sglang_source` tests.

The `sglang` extra of pyproject.toml pins one version. `pip download --no-deps sglang==<it>` fetches
its wheel into a cache folder and the wheel is unpacked there; it is never installed (it pins CUDA
builds of torch and its kernels). The tests import it in a child process (`sglang_checker.py`)
with the unpacked folder first on `sys.path`, beside the CPU torch of this environment, so its
import-time patches (transformers, torch.mps) never touch the test process.

    python tests/engine/sglang_wheel.py      fetch and unpack (what `make sglang-wheel` runs)

The cache is `$AREAL_NB_SGLANG_WHEEL_CACHE`, else `~/.cache/areal_nb/sglang-wheel`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pinned_version() -> str:
    """The exact version the `sglang` extra pins (`sglang==X`); a range is an error."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = extras["sglang"]
    match = re.fullmatch(r"sglang==([\w.]+)", requirement.replace(" ", ""))
    if match is None:
        raise ValueError(f"the sglang extra must pin one version (sglang==X), got {requirement!r}")
    return match.group(1)


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "areal_nb" / "sglang-wheel"
    return Path(os.environ.get("AREAL_NB_SGLANG_WHEEL_CACHE") or default)


def unpacked_wheel(fetch: bool = True) -> Path:
    """The folder holding the unpacked `sglang` package of the pinned version, fetched if needed.

    Raises RuntimeError saying why when it cannot be fetched (no network, no wheel for this Python)."""
    version = pinned_version()
    site = cache_dir() / version / f"py{sys.version_info.major}{sys.version_info.minor}"
    if (site / "sglang" / "version.py").is_file():
        return site
    if not fetch:
        raise RuntimeError(f"sglang {version} is not unpacked under {site}")
    download = cache_dir() / version / "download"
    download.mkdir(parents=True, exist_ok=True)
    wheels = [w for w in download.glob(f"sglang-{version}-*.whl") if _fits(w)]
    if not wheels:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                f"sglang=={version}",
                "-d",
                str(download),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        wheels = [w for w in download.glob(f"sglang-{version}-*.whl") if _fits(w)]
        if done.returncode != 0 or not wheels:
            raise RuntimeError(
                f"pip download sglang=={version} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-600:]}"
            )
    partial = site.with_name(site.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(partial)
    partial.replace(site)  # whole or not at all: a half-unpacked folder is never taken for the wheel
    return site


def _fits(wheel: Path) -> bool:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"-{tag}-" in wheel.name or "-py3-none-any" in wheel.name


if __name__ == "__main__":
    try:
        print(unpacked_wheel())
    except RuntimeError as exc:
        print(f"sglang wheel: {exc}", file=sys.stderr)
        raise SystemExit(1) from None

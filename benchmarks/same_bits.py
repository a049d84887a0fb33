"""Does this checkout build the built-in models to the same bits as another commit's code?

A refactor of a file the build reads (`models/registry.py`: `_tokenizer_sources`, ...) changes
`recipe_key`, so the shipped models stop being used; rebuilding them here would replace the files
built on another CPU (`models/shipped.py`). Instead this builds both versions on this machine
(`areal-nb build-models --out`, side by side, one thread each), compares every file but
`build_info.json` by SHA-256 and prints the held-out figures of each build. With `--rekey`, when
every file is the same, it writes this checkout's recipe keys into the shipped `build_info.json`
files and changes nothing else. Exit status 1 when a file differs.

    python benchmarks/same_bits.py [--base main] [--rekey] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_build(source: Path, out: Path) -> subprocess.Popen:
    """`areal-nb build-models` of the code under `source` into `out/models` (log: `out/build.log`)."""
    out.mkdir(parents=True)
    env = os.environ | {
        "PYTHONPATH": str(source),
        "OMP_NUM_THREADS": "1",
        "AREAL_NB_CACHE": str(out / "cache"),
    }
    command = [sys.executable, "-m", "areal_nb.cli", "build-models", "--out", str(out / "models")]
    with open(out / "build.log", "w") as log:
        return subprocess.Popen(command, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)


def digests(models: Path) -> dict[str, str]:
    return {
        p.relative_to(models).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(models.rglob("*"))
        if p.is_file() and p.name != "build_info.json"
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="main", help="the commit whose code built the shipped models")
    parser.add_argument("--rekey", action="store_true", help="re-key the shipped models when all is the same")
    parser.add_argument(
        "--keep", type=Path, help="build into this new folder and keep it (default: a scratch one)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="same-bits-") as scratch:
        work = args.keep or Path(scratch)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "areal_nb"], capture_output=True, check=True
        )
        tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(work / "base-source", filter="data")
        builds = {
            "base": start_build(work / "base-source", work / "base"),
            "this": start_build(ROOT, work / "this"),
        }
        print(
            f"building {args.base} and this checkout's models side by side (logs: {work}/*/build.log) …",
            flush=True,
        )
        for side, process in builds.items():
            if process.wait() != 0:
                print(f"the {side} build failed: see {work / side / 'build.log'}", file=sys.stderr)
                return 2
        base, this = digests(work / "base" / "models"), digests(work / "this" / "models")
        for path in sorted(base.keys() | this.keys()):
            same = base.get(path) == this.get(path)
            print(f"{path}: {base.get(path)} {this.get(path)} {'same' if same else 'DIFFERENT'}")
        for side in builds:
            for info_path in sorted((work / side / "models").glob("*/build_info.json")):
                info = json.loads(info_path.read_text())
                figures = {k: v for k, v in info.items() if k.startswith("held_out_") or k == "final_loss"}
                print(f"{side} {info['name']}: {figures}")
    if base != this:
        return 1
    if args.rekey:
        from areal_nb.models.registry import BUILT_IN_NAMES, recipe_key
        from areal_nb.models.shipped import recorded_info, shipped_root

        for name in BUILT_IN_NAMES:
            info = recorded_info(name) | {"recipe_key": recipe_key(name)}
            (shipped_root() / name / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
            print(f"{name}: shipped build_info.json re-keyed to {info['recipe_key']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

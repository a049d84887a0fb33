"""`areal-nb build-models [NAME ...] [--check] [--out DIR]`: the shipped built-in models, from their recipe.

Builds `tiny-math` and `tiny-tools` (or the names given) from scratch, one torch thread, into the
package's `areal_nb/models/shipped/` (about 2 + 4 minutes on one CPU core). After an edit of a
recipe, a data generator or a builder, run it and commit the new files; the weights' hash it
prints goes into `tests/models/test_shipped.py`. `--check` builds into a scratch folder instead
and compares the weights with the shipped ones: equal on the CPU that built them; another CPU's
kernels may give other weights, which is why the files are shipped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from areal_nb.models.registry import BUILT_IN_NAMES
    from areal_nb.models.shipped import build, recorded_info, shipped_root

    parser = argparse.ArgumentParser(prog="areal-nb build-models", description=__doc__.split("\n")[0])
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(BUILT_IN_NAMES)}"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="build into a scratch folder and compare with the shipped weights (exit 1 if they differ)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"where to write (default {shipped_root()})")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    unknown = [n for n in args.names if n not in BUILT_IN_NAMES]
    if unknown:
        parser.error(f"unknown built-in model(s) {', '.join(unknown)}; expected {', '.join(BUILT_IN_NAMES)}")
    names = args.names or list(BUILT_IN_NAMES)

    if not args.check:
        out = args.out or shipped_root()
        for name, info in build(names, out).items():
            print(f"{name}: {_score(info)}, weights sha256 {info['weights_sha256']} -> {out / name}")
        return 0

    differ = []
    with tempfile.TemporaryDirectory(prefix="areal-nb-check-") as scratch:
        for name, info in build(names, args.out or Path(scratch)).items():
            shipped = recorded_info(name) or {}
            same = shipped.get("weights_sha256") == info["weights_sha256"]
            print(
                f"{name}: rebuilt {info['weights_sha256']} ({_score(info)}), shipped "
                f"{shipped.get('weights_sha256')} ({_score(shipped) if shipped else 'none'}): "
                f"{'same' if same else 'DIFFERENT'}"
            )
            differ += [] if same else [name]
    return 1 if differ else 0


def _score(info: dict) -> str:
    if "held_out_accuracy" in info:
        return f"held-out accuracy {info['held_out_accuracy']}"
    return f"held-out success {info.get('held_out_success')}"

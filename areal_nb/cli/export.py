"""`areal-nb export CONFIG [key=value ...] --out DIR`: a run folder from a YAML config.

The same folder `session.export(DIR)` writes from a notebook, without a checkpoint: the job
starts from `model.path`. The agent must be importable by the config's `agent.workflow` path.
"""

from __future__ import annotations

import argparse
import shlex
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="areal-nb export", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. total_steps=50 cluster.nodes=2")
    parser.add_argument("--out", required=True, help="the run folder to write (must not exist or be empty)")
    parser.add_argument("--nproc", type=int, default=None, help="trainer processes per node "
                        "(cluster.nproc_per_node)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")
    args = parser.parse_intermixed_args(argv)  # overrides may come after --out / --nproc

    from areal_nb.config import ConfigError, load_config
    from areal_nb.export import ExportError, export_run

    # (`is not None`: --nproc 0 must reach the config's check, not fall back to its value)
    nproc = [] if args.nproc is None else [f"cluster.nproc_per_node={args.nproc}"]
    overrides = list(args.overrides) + nproc
    try:
        config = load_config(args.config, overrides)
        out = export_run(args.out, config, overwrite=args.overwrite,
                         command="areal-nb export " + shlex.join(argv))
    except (ConfigError, ExportError) as exc:
        print(f"areal-nb export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user gave: not readable, not writable, a file where a folder goes
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"areal-nb export: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    print(f"wrote {out}: bash {out}/launch_local.sh, or sbatch job.sbatch from that folder")
    return 0

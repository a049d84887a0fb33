"""The demo config through `engine.type: remote` against two `areal-nb engine-server` processes.

The demo through engine servers: starts two engine servers (tiny-math, loopback, shared weights dir),
runs `areal-nb demo` with `engine.type=remote engine.addresses=[...]`, and prints held-out
accuracy before/after next to the embedded engine's figures from a `make demo` summary.json.

    PYTHONPATH=. .venv/bin/python benchmarks/remote_demo.py --embedded runs/demo/summary.json \
        [--out runs/remote_demo] [overrides, e.g. total_steps=10]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port

API_KEY = "remote-demo"


def start_servers(n: int, weights_dir: Path, log_dir: Path) -> list[ServerProcess]:
    # the servers share this machine's cores with each other and the trainer: one torch thread
    # each (OpenMP threads that outnumber the cores wait on each other at every operation)
    threads = max(1, (os.cpu_count() or 1) // n)
    procs = []
    try:
        for i in range(n):
            port = free_port()
            cmd = engine_server_command(
                "tiny-math",
                port=port,
                api_key=API_KEY,
                weights_dir=weights_dir,
                extra_args=["--torch-threads", str(threads)],
            )
            procs.append(
                ServerProcess(cmd, f"http://127.0.0.1:{port}", log_path=log_dir / f"server-{i}.log").start()
            )
        for proc in procs:
            proc.wait_ready(timeout=600, headers={"Authorization": f"Bearer {API_KEY}"})
        return procs
    except BaseException:
        for proc in procs:
            proc.stop()
        raise


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--embedded", help="summary.json of the embedded-engine demo run (same config, seed)")
    parser.add_argument("--out", default="runs/remote_demo")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from areal_nb import demo

    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    weights_dir = Path(tempfile.mkdtemp(prefix="remote-demo-weights-"))
    procs = start_servers(args.servers, weights_dir, out)
    try:
        addresses = ",".join(p.url for p in procs)
        demo.main(
            [
                "--out",
                str(out),
                "engine.type=remote",
                f"engine.addresses=[{addresses}]",
                f"engine.api_key={API_KEY}",
                f"engine.weights_dir={weights_dir}",
                *args.overrides,
            ]
        )
    finally:
        for proc in procs:
            proc.stop()
    remote = json.loads((out / "summary.json").read_text())
    rows = [("remote (2 engine-servers)", remote)]
    if args.embedded:
        rows.insert(0, ("embedded (engine.type local)", json.loads(Path(args.embedded).read_text())))
    print(
        f"\n{'run':<30} {'steps':>5} {'acc before':>10} {'acc after':>10} {'agent before':>12} {'agent after':>11} "
        f"{'max |logp diff|':>15} {'wall s':>7}"
    )
    for name, s in rows:
        diff = s.get("logprob_abs_diff_max")  # engine-recorded vs trainer-recomputed, worst step
        print(
            f"{name:<30} {s['steps']:>5} {s['accuracy_before']:>10.3f} {s['accuracy_after']:>10.3f} "
            f"{s['agent_accuracy_before']:>12.3f} {s['agent_accuracy_after']:>11.3f} "
            f"{'-' if diff is None else f'{diff:.1e}':>15} {s['wall_s']:>7.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

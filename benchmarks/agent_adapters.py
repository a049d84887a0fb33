"""What one adapter per agent (`agents`) costs a rollout, on the two-agent example, in one run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/agent_adapters.py [--batches 3] [--batch-size 8]

Three Sessions on `configs/solver_checker.yaml` (tiny-math, the solver and the checker):
- `shared`: one policy plays both agents, one embedded engine (the baseline);
- `embedded`: `agents` with one LoRA adapter each; one embedded engine per agent, each serving its
  agent's merged weights;
- `engine-server`: the same adapters on one launched `areal-nb engine-server`, which holds both
  adapters and serves one at a time (a request of the other agent waits for the running batch).

Each Session rolls out `--batches` batches after a warm-up batch (no training: the weights stay
the initial ones, so all three generate from the same policy); prints each setup's generated
tokens per second of rollout wall time, the ratios against `shared`, the engines' resident
parameters (the embedded engines' copies; a server's are its own), the load average, and one JSON
line with all of it. Timings on a shared machine are
noisy: rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from areal_nb import Session  # noqa: E402

CONFIG = ROOT / "configs" / "solver_checker.yaml"
ADAPTERS = {"solver": {"lora": {"r": 8}}, "checker": {"lora": {"r": 8}}}


def rollout_rate(session: Session, batches: int) -> float:
    """Generated tokens per second of rollout wall time over `batches` batches (after a warm-up)."""
    session.rollout()
    tokens, seconds = 0, 0.0
    for _ in range(batches):
        start = time.perf_counter()
        batch = session.rollout()
        seconds += time.perf_counter() - start
        tokens += int(batch.to_tensors().loss_mask.sum())
    return tokens / seconds


def engine_parameters(session: Session) -> int:
    engines = getattr(session.engine, "engines", None) or {"": session.engine}
    return sum(sum(p.numel() for p in e.model.parameters()) for e in engines.values() if hasattr(e, "model"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=3, help="timed batches per setup")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per batch (4 samples each)")
    args = parser.parse_args()
    common = {
        "logging__progress": False,
        "rollout__prefetch": False,
        "rollout__batch_size": args.batch_size,
        "rollout__group_size": 4,
        "logging__eval_every": 0,
    }
    setups = {
        "shared": {},
        "embedded": {"agents": ADAPTERS},
        "engine-server": {
            "agents": ADAPTERS,
            "engine__type": "sglang",
            "engine__launch__command": "engine-server",
            "engine__launch__n_servers": 1,
        },
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in setups.items():
            with Session(CONFIG, logging__run_dir=f"{tmp}/{name}", **common, **overrides) as session:
                rate = rollout_rate(session, args.batches)
                results[name] = {"tokens_per_s": rate, "engine_parameters": engine_parameters(session)}
            print(
                f"{name:>14}: {rate:8.1f} generated tokens/s, engine parameters {results[name]['engine_parameters']:,}"
            )
    base = results["shared"]["tokens_per_s"]
    for name in ("embedded", "engine-server"):
        results[name]["vs_shared"] = results[name]["tokens_per_s"] / base
        print(f"{name} / shared: {results[name]['vs_shared']:.2f}x")
    load = os.getloadavg()[0]
    print(f"load average (1 min): {load:.1f}")
    print(json.dumps({"batches": args.batches, "batch_size": args.batch_size, "load": load, **results}))


if __name__ == "__main__":
    main()

"""LoRA (`actor.lora`) against full fine-tuning on the demo config, in one run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/lora.py [--steps 4] [--r 8]

Two Sessions on `configs/multi_turn_math.yaml` (tiny-math): full fine-tuning, and LoRA with rank
`--r` on every linear layer (`target_modules: all-linear`). Each step the full run rolls out one
batch and both train on that same batch, in turn, so they do the same work under the same load.
The train step is `Session.train_step`: the update and the weight push to the engine (for LoRA
the merged base + ΔW).

Prints, per setup: trainable parameters, AdamW state bytes (its moments, after a step), the mean
train-step wall and process-CPU time over the steps after the first (which warms up); then the
ratios full / LoRA, the load average, and one JSON line with all of it. Timings on a shared
machine are noisy: compare the CPU times, and rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from areal_nb import Session  # noqa: E402

CONFIG = ROOT / "configs" / "multi_turn_math.yaml"


def optimizer_bytes(session: Session) -> int:
    return sum(
        value.numel() * value.element_size()
        for state in session.actor.optimizer.state.values()
        for value in state.values()
        if hasattr(value, "element_size") and value.dim() > 0
    )


def timed_step(session: Session, batch) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    session.train_step(batch)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="train steps per setup (the first warms up)")
    parser.add_argument("--r", type=int, default=8, help="the adapter's rank")
    args = parser.parse_args()
    common = {"logging__progress": False, "rollout__prefetch": False}
    lora = {"r": args.r, "alpha": 2 * args.r, "target_modules": "all-linear"}
    setups: dict[str, Session] = {}
    times: dict[str, list[tuple[float, float]]] = {"full": [], "lora": []}
    try:
        setups["full"] = Session(CONFIG, **common)
        setups["lora"] = Session(CONFIG, actor__lora=lora, **common)
        for _ in range(args.steps):
            batch = setups["full"].rollout()
            for name, session in setups.items():
                times[name].append(timed_step(session, batch))
        results = {}
        for name, session in setups.items():
            measured = times[name][1:] or times[name]
            results[name] = {
                "trainable_params": sum(p.numel() for p in session.actor.params),
                "optimizer_state_bytes": optimizer_bytes(session),
                "train_step_s": statistics.mean(w for w, _ in measured),
                "train_step_cpu_s": statistics.mean(c for _, c in measured),
            }
    finally:
        for session in setups.values():
            session.close()
    full, adapted = results["full"], results["lora"]
    ratios = {key: full[key] / adapted[key] for key in full}
    for name, figures in results.items():
        print(
            f"{name:5s} trainable {figures['trainable_params']:>9,}  optimizer state "
            f"{figures['optimizer_state_bytes'] / 1e6:7.3f} MB  train step {figures['train_step_s'] * 1e3:7.0f} ms "
            f"wall, {figures['train_step_cpu_s'] * 1e3:7.0f} ms CPU"
        )
    print(
        "full / lora: "
        + ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items())
        + f"  (load {os.getloadavg()[0]:.1f}, {args.steps} steps, r={args.r})"
    )
    print(json.dumps({"results": results, "full_over_lora": ratios, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()

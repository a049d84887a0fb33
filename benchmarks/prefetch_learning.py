"""Rollouts running ahead of training (`rollout.prefetch`) against not: learning and step time.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/prefetch_learning.py [--steps 60] [--seeds 1 2]
        [--variants off on] [--out runs/prefetch] [override ...]

Each variant trains the demo config (`configs/multi_turn_math.yaml`, the given dotted overrides
applied) from the same warm start for `--steps` steps, one run after the other, seeds in turn:
"off" is `rollout.prefetch=false` (every batch generated at the current version, the demo's
default), "on" is `rollout.prefetch=true` (the next batches are generated while the current one
trains, within `rollout.max_head_offpolicyness`, and trained with the decoupled loss). Extra
variants: "on_s1" (prefetch, staleness bound 1), "on_plain" (prefetch without the decoupled loss:
what the behaviour weight buys).

`--repeats N` runs each (seed, variant) N times, the variants interleaved (off, on, off, on, ...),
and `--no-eval` skips the held-out evaluation: for step time on a noisy machine.

Per run: held-out greedy accuracy before/after (first reply, the demo's figure) on the same 200
problems; training reward (mean episode return) first 5 / last 5 steps and the lowest 5-step
mean (a collapse shows there); wall and process CPU per training step (median, and the run's
total over steps); staleness (versions between sampling and training, loss tokens) and the
behaviour weights π_prox/π_behave of the decoupled loss (mean over steps of each step's
mean/max, and the share of loss tokens masked by the cap). Then, per variant other than
"off", the ratio of its median step wall time and of its held-out gain to "off"'s, same seed.

A history CSV per run goes to `--out`. The last line is one JSON object with every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {
    "off": ["rollout.prefetch=false"],
    "on": ["rollout.prefetch=true"],
    "on_s1": ["rollout.prefetch=true", "rollout.max_head_offpolicyness=1"],
    "on_plain": ["rollout.prefetch=true", "actor.use_decoupled_loss=false"],
}


def _mean(values) -> float | None:
    values = [float(v) for v in values if v == v]  # drop NaN
    return sum(values) / len(values) if values else None


def run_one(
    config: str, overrides: list[str], steps: int, out: Path, name: str, evaluate: bool = True
) -> dict:
    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(
        config,
        [
            *overrides,
            f"total_steps={steps}",
            "logging.eval_every=0",
            "logging.progress=false",
            f"logging.run_dir={out / name}",
        ],
    )
    with Session(cfg) as session:
        before = session.evaluate() if evaluate else None
        times: list[tuple[float, float]] = []
        step = session.step

        def timed_step():
            wall, cpu = time.perf_counter(), time.process_time()
            row = step()
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
            return row

        session.step = timed_step  # run() calls self.step() once per training step
        wall0, cpu0 = time.perf_counter(), time.process_time()
        history = session.run(steps)
        run_wall, run_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        after = session.evaluate() if evaluate else None
    history.to_csv(out / f"{name}.csv", index=False)
    rewards = [float(r) for r in history["reward_mean"]]
    k = min(5, len(rewards))
    windows = [sum(rewards[i : i + k]) / k for i in range(len(rewards) - k + 1)]

    def col(name: str) -> list[float]:
        return list(history[name]) if name in history else []

    return {
        "name": name,
        "overrides": overrides,
        "accuracy_before": before.accuracy if evaluate else float("nan"),
        "accuracy_after": after.accuracy if evaluate else float("nan"),
        "gain_points": 100 * (after.accuracy - before.accuracy) if evaluate else float("nan"),
        "agent_accuracy_after": after.agent_accuracy if evaluate else float("nan"),
        "reward_first5": sum(rewards[:k]) / k,
        "reward_last5": sum(rewards[-k:]) / k,
        "reward_min5": min(windows),
        "step_wall_median_s": statistics.median(t[0] for t in times),
        "step_cpu_median_s": statistics.median(t[1] for t in times),
        "run_wall_s": run_wall,
        "run_cpu_s": run_cpu,
        "staleness_mean": _mean(col("staleness_mean")),
        "staleness_max": max(col("staleness_max"), default=None),
        "behave_weight_mean": _mean(col("behave_imp_weight_mean")),
        "behave_weight_max_mean": _mean(col("behave_imp_weight_max")),
        "behave_masked_frac": _mean(col("behave_masked_frac")),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml")
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--variants", nargs="+", default=["off", "on"], choices=sorted(VARIANTS))
    parser.add_argument("--out", default="runs/prefetch")
    parser.add_argument("--no-eval", action="store_true", help="step time only: no held-out evaluation")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per (seed, variant), variants interleaved"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    results = []
    for seed in args.seeds:
        for repeat, variant in ((r, v) for r in range(args.repeats) for v in args.variants):
            name = f"{variant}_seed{seed}" + (f"_r{repeat}" if args.repeats > 1 else "")
            r = run_one(
                args.config,
                [*args.overrides, f"seed={seed}", *VARIANTS[variant]],
                args.steps,
                out,
                name,
                evaluate=not args.no_eval,
            )
            results.append(r)
            print(
                f"{name:>14}: held-out {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} "
                f"({r['gain_points']:+.1f} points); reward first5 {r['reward_first5']:.3f} last5 "
                f"{r['reward_last5']:.3f} min5 {r['reward_min5']:.3f}; step {r['step_wall_median_s']:.2f} s wall "
                f"{r['step_cpu_median_s']:.2f} s CPU (median), run {r['run_wall_s']:.0f} s; staleness mean "
                f"{r['staleness_mean'] or 0:.2f} max {r['staleness_max']}; behave weight mean "
                f"{r['behave_weight_mean'] or float('nan'):.3f}, masked {r['behave_masked_frac'] or 0:.4f}; "
                f"load {r['load_average'][0]:.1f}",
                flush=True,
            )
    ratios = []
    for r in results:
        base = next((b for b in results if b["name"] == "off_seed" + r["name"].split("_seed", 1)[1]), None)
        if base is None or base is r:
            continue
        ratios.append(
            {
                "name": r["name"],
                "step_wall_ratio": r["step_wall_median_s"] / base["step_wall_median_s"],
                "run_wall_ratio": r["run_wall_s"] / base["run_wall_s"],
                "gain_points_vs_off": r["gain_points"] - base["gain_points"],
            }
        )
        print(
            f"{r['name']:>14} / off: step wall {ratios[-1]['step_wall_ratio']:.2f}x, run wall "
            f"{ratios[-1]['run_wall_ratio']:.2f}x, held-out gain {ratios[-1]['gain_points_vs_off']:+.1f} points vs off"
        )
    print(json.dumps({"runs": results, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The demo configuration under each `actor.algorithm` preset: held-out gain and step time.

For every preset and seed a fresh Session trains configs/multi_turn_math.yaml (the two-turn math
agent on tiny-math) with `actor.algorithm=<preset>` and the preset's own clip ranges (the config's
`eps_clip: 0.4` is unset, so each preset brings its own; every other setting is the demo's, the
decoupled loss included), and reports held-out greedy first-reply accuracy before and after, the
gain, the mean train-step time (`train_seconds`) and the ratio of both to the `grpo` preset measured
in the same run.

    # the full comparison: 7 presets × 3 seeds × ~2.5 min (60 steps) on an idle 2-core CPU ≈ 55 min
    .venv/bin/python benchmarks/algorithms.py
    # a reduced run (minutes): few steps, one seed, a small held-out set
    .venv/bin/python benchmarks/algorithms.py --steps 4 --seeds 1 --eval-size 40 rollout.batch_size=4

Writes `<out>/results.json` and `<out>/table.md` and prints the markdown table. Timings on a
shared machine are noisy; the engine's continuous batching makes sampling depend on timing, so
runs with the same seed are not bit-identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp")


def train_and_evaluate(cfg, steps: int) -> dict:
    """One run; the only code that touches the Session API."""
    from areal_nb.session import Session

    with Session(cfg) as session:
        before = session.evaluate().accuracy
        history = session.run(steps)
        after = session.evaluate().accuracy
    return {
        "before": before,
        "after": after,
        "gain": after - before,
        "step_s": float(history["train_seconds"].mean()),
        "reward_per_step": [float(r) for r in history["reward_mean"]],
    }


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for preset in dict.fromkeys(r["preset"] for r in runs):
        group = [r for r in runs if r["preset"] == preset]
        rows.append(
            {
                "preset": preset,
                "seeds": [r["seed"] for r in group],
                **{k: mean_std([r[k] for r in group]) for k in ("before", "after", "gain", "step_s")},
            }
        )
    base = next((r for r in rows if r["preset"] == "grpo"), None)
    for row in rows:
        row["step_s_vs_grpo"] = row["step_s"][0] / base["step_s"][0] if base else float("nan")
        row["gain_minus_grpo"] = row["gain"][0] - base["gain"][0] if base else float("nan")
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| preset | seeds | held-out before → after | gain | gain − grpo's | train step s | × grpo's |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {len(r['seeds'])} | {r['before'][0]:.3f} → {r['after'][0]:.3f} ± {r['after'][1]:.3f} "
            f"| {r['gain'][0]:+.3f} ± {r['gain'][1]:.3f} | {r['gain_minus_grpo']:+.3f} | {r['step_s'][0]:.2f} "
            f"| {r['step_s_vs_grpo']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi_turn_math.yaml"))
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default: total_steps)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--eval-size", type=int, default=None, help="held-out problems (default: the config's)"
    )
    parser.add_argument("--out", default="runs/algorithms")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    args = parser.parse_args()

    from areal_nb.config import load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    for preset in args.presets:
        for seed in args.seeds:
            overrides = [
                *args.overrides,
                f"seed={seed}",
                f"engine.seed={seed}",
                f"data.seed={seed}",
                f"actor.algorithm={preset}",
                "actor.eps_clip=null",
                "actor.eps_clip_higher=null",
                "logging.eval_every=0",
                "logging.progress=false",
            ]
            if args.eval_size is not None:
                overrides.append(f"data.eval_size={args.eval_size}")
            if args.steps is not None:  # the learning-rate schedule decays over the run's own length
                overrides.append(f"total_steps={args.steps}")
            cfg = load_config(args.config, overrides)
            t0 = time.perf_counter()
            run = {
                "preset": preset,
                "seed": seed,
                **train_and_evaluate(cfg, cfg.total_steps),
                "wall_s": time.perf_counter() - t0,
            }
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "reward_per_step"}), flush=True)
            (out / "results.json").write_text(json.dumps({"runs": runs}, indent=2))  # partial results survive
    rows = summarise(runs)
    table = markdown_table(rows)
    (out / "results.json").write_text(
        json.dumps(
            {"config": args.config, "overrides": args.overrides, "runs": runs, "presets": rows}, indent=2
        )
    )
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)


if __name__ == "__main__":
    main()

"""Leaf vs turn credit on the demo configuration: does training each turn's tokens on
that turn's own return help a multi-turn agent?

For every condition (credit × discount γ) and seed, a fresh Session trains the demo configuration
(configs/multi_turn_math.yaml: AReaL's two-turn math agent, concat export, tree discount) and
reports held-out greedy accuracy of the first reply and success within 2 turns, before and after
training, and the reward curve (mean episode return per step).

    # the full experiment (about 3 conditions × 3 seeds × ~7.5 min on an idle 2-core CPU ≈ 70 min;
    # run it on a quiet machine)
    .venv/bin/python benchmarks/credit_experiment.py
    # a smoke run (a minute or two)
    .venv/bin/python benchmarks/credit_experiment.py --steps 2 --seeds 1 --eval-size 20 rollout.batch_size=4

Leaf credit with concat rows does not depend on γ: the row trains on its leaf's reward, and a leaf
has no children to discount. So leaf runs once (at the first γ) unless `--leaf-every-discount`.
Runs with the same seed share the seeds and the prompt order; the engine's continuous batching
makes sampling depend on timing, so even their first rollouts are not bit-identical.
Writes `<out>/results.json` (every run, with its reward curve, and the per-condition means) and
`<out>/table.md`, `<out>/reward_curves.png`; prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train_and_evaluate(cfg, steps: int, turns: int = 2) -> dict:
    """One run; the only code that touches the Session API (adapt here when it changes)."""
    from areal_nb.session import Session

    # evaluate() runs the configured agent greedily: "within k turns" is within its own max_turns
    agent_turns = int(cfg.agent.workflow_kwargs.get("max_turns", 1))
    if agent_turns != turns:
        raise ValueError(
            f"--turns {turns} differs from the agent's max_turns {agent_turns} "
            f"(set agent.workflow_kwargs.max_turns={turns})"
        )
    with Session(cfg) as session:
        first = session.evaluate()
        history = session.run(steps)
        last = session.evaluate()
    before = {"first_reply": first.accuracy, "within_turns": first.agent_accuracy}
    after = {"first_reply": last.accuracy, "within_turns": last.agent_accuracy}
    return {"before": before, "after": after, "reward_per_step": [float(r) for r in history["reward_mean"]]}


def conditions(
    credits: list[str], discounts: list[float], leaf_every_discount: bool
) -> list[tuple[str, float]]:
    out = []
    for credit in credits:
        for i, gamma in enumerate(discounts):
            if credit == "leaf" and i > 0 and not leaf_every_discount:
                continue  # identical to leaf at the first γ (see the module docstring)
            out.append((credit, gamma))
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(runs: list[dict]) -> list[dict]:
    """Per condition: means and standard deviations over seeds, and the mean reward curve."""
    rows = []
    for key in dict.fromkeys((r["credit"], r["discount"]) for r in runs):
        group = [r for r in runs if (r["credit"], r["discount"]) == key]
        k = min(5, min(len(r["reward_per_step"]) for r in group))
        row = {"credit": key[0], "discount": key[1], "seeds": [r["seed"] for r in group]}
        for metric in ("first_reply", "within_turns"):
            for when in ("before", "after"):
                row[f"{metric}_{when}"] = mean_std([r[when][metric] for r in group])
            row[f"{metric}_gain"] = mean_std([r["after"][metric] - r["before"][metric] for r in group])
        row["reward_first5"] = mean_std([statistics.fmean(r["reward_per_step"][:k]) for r in group])
        row["reward_last5"] = mean_std([statistics.fmean(r["reward_per_step"][-k:]) for r in group])
        row["reward_curve_mean"] = [
            statistics.fmean(step) for step in zip(*(r["reward_per_step"] for r in group), strict=False)
        ]
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], turns: int) -> str:
    def ms(pair: tuple[float, float], signed: bool = False) -> str:
        return f"{pair[0]:+.3f} ± {pair[1]:.3f}" if signed else f"{pair[0]:.3f} ± {pair[1]:.3f}"

    lines = [
        f"| credit | γ | seeds | first reply before → after | gain | within {turns} turns before → after | gain "
        "| reward first 5 → last 5 steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['credit']} | {r['discount']:g} | {len(r['seeds'])} | {ms(r['first_reply_before'])} → "
            f"{ms(r['first_reply_after'])} | {ms(r['first_reply_gain'], True)} | {ms(r['within_turns_before'])} → "
            f"{ms(r['within_turns_after'])} | {ms(r['within_turns_gain'], True)} | {ms(r['reward_first5'])} → "
            f"{ms(r['reward_last5'])} |"
        )
    return "\n".join(lines)


def plot_curves(runs: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, row in enumerate(rows):
        colour = f"C{i}"
        label = f"{row['credit']} credit, γ {row['discount']:g}"
        for r in runs:
            if (r["credit"], r["discount"]) == (row["credit"], row["discount"]):
                ax.plot(
                    range(1, len(r["reward_per_step"]) + 1),
                    r["reward_per_step"],
                    color=colour,
                    alpha=0.25,
                    lw=0.8,
                )
        curve = row["reward_curve_mean"]
        ax.plot(
            range(1, len(curve) + 1),
            curve,
            color=colour,
            lw=2,
            label=f"{label} (mean of {len(row['seeds'])})",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("mean episode return")
    ax.set_title("leaf vs turn credit: reward curves (thin: single seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi_turn_math.yaml"))
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default: the config's total_steps)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--credits", nargs="+", default=["leaf", "turn"], choices=["leaf", "turn"])
    parser.add_argument("--discounts", type=float, nargs="+", default=[0.9, 0.5])
    parser.add_argument("--leaf-every-discount", action="store_true", help="also run leaf credit at every γ")
    parser.add_argument(
        "--eval-size", type=int, default=None, help="held-out problems (default: the config's)"
    )
    parser.add_argument("--turns", type=int, default=2, help="turns allowed in the within-k-turns evaluation")
    parser.add_argument("--out", default="runs/credit_experiment")
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides for every run, e.g. rollout.batch_size=4"
    )
    args = parser.parse_args()

    from areal_nb.config import load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    for credit, gamma in conditions(args.credits, args.discounts, args.leaf_every_discount):
        for seed in args.seeds:
            overrides = [
                *args.overrides,
                f"seed={seed}",
                f"engine.seed={seed}",
                f"data.seed={seed}",
                f"actor.credit={credit}",
                f"agent.turn_discount={gamma}",
                "logging.eval_every=0",
                "logging.progress=false",
            ]
            if args.eval_size is not None:
                overrides.append(f"data.eval_size={args.eval_size}")
            cfg = load_config(args.config, overrides)
            steps = cfg.total_steps if args.steps is None else args.steps
            if args.steps is not None:  # the learning-rate schedule decays over the run's own length
                cfg = load_config(args.config, [*overrides, f"total_steps={steps}"])
            t0 = time.perf_counter()
            result = train_and_evaluate(cfg, steps, args.turns)
            run = {
                "credit": credit,
                "discount": gamma,
                "seed": seed,
                "steps": steps,
                "wall_s": time.perf_counter() - t0,
                **result,
            }
            runs.append(run)
            keys = ("credit", "discount", "seed", "before", "after", "wall_s")
            print(json.dumps({k: run[k] for k in keys}), flush=True)
            (out / "results.json").write_text(json.dumps({"runs": runs}, indent=2))  # partial results survive

    rows = summarise(runs)
    table = markdown_table(rows, args.turns)
    (out / "results.json").write_text(
        json.dumps(
            {"config": args.config, "overrides": args.overrides, "runs": runs, "conditions": rows}, indent=2
        )
    )
    (out / "table.md").write_text(table + "\n")
    plot_curves(runs, rows, out / "reward_curves.png")
    print()
    print(table)
    print(f"\nwrote {out / 'results.json'}, {out / 'table.md'}, {out / 'reward_curves.png'}")


if __name__ == "__main__":
    main()

"""`areal-nb demo` / `make demo`: the main job.

Trains AReaL's multi-turn math agent (a plain OpenAI-SDK agent behind the proxy) with GRPO
on the built-in `tiny-math` model and the embedded engine, then writes
`runs/demo/reward_curve.png` and `runs/demo/summary.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

_DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"


def _plot_curve(
    history,
    accuracy_before: float,
    accuracy_after: float,
    path: Path,
    agent: tuple[float, float, int] | None = None,
    title: str = "areal_nb demo: multi-turn math GRPO on tiny-math",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history["step"], history["reward_mean"], marker="o", ms=3, label="mean episode reward")
    window = min(5, len(history))
    if window > 1:
        ax.plot(history["step"], history["reward_mean"].rolling(window).mean(), label=f"{window}-step mean")
    ax.axhline(
        accuracy_before, color="grey", ls=":", label=f"held-out accuracy before ({accuracy_before:.2f})"
    )
    ax.axhline(
        accuracy_after, color="green", ls="--", label=f"held-out accuracy after ({accuracy_after:.2f})"
    )
    if agent is not None:
        agent_before, agent_after, turns = agent
        ax.axhline(
            agent_before,
            color="grey",
            ls="-.",
            lw=0.8,
            label=f"within {turns} turns, before ({agent_before:.2f})",
        )
        ax.axhline(
            agent_after,
            color="purple",
            ls="-.",
            lw=0.8,
            label=f"within {turns} turns, after ({agent_after:.2f})",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="areal-nb demo", description=__doc__)
    parser.add_argument("--config", default=str(_DEFAULT_CONFIG))
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. total_steps=10 actor.lr=1e-4")
    args = parser.parse_args(argv)

    from areal_nb.config import load_config
    from areal_nb.session import Session

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.config, [*args.overrides, "logging.eval_every=0"])
    t0 = time.perf_counter()
    turns = int(cfg.agent.workflow_kwargs.get("max_turns", 1))
    with Session(cfg) as session:
        print(f"proxy at {session.proxy_url}; engine version {session.engine.get_version()}")
        # One greedy run of the agent gives both figures: its first reply, and its own turns.
        first = session.evaluate()
        before, agent_before = first.accuracy, first.agent_accuracy
        print(
            f"held-out greedy accuracy before training: {before:.3f} first reply, {agent_before:.3f} within "
            f"{turns} turns ({first.n} problems)"
        )
        history = session.run(cfg.total_steps)
        last = session.evaluate()
        after, agent_after = last.accuracy, last.agent_accuracy
        print(
            f"held-out greedy accuracy after training:  {after:.3f} first reply, {agent_after:.3f} within "
            f"{turns} turns"
        )
        batch = session.last_batch
        if batch is not None:
            print("\nlast batch, a few calls:")
            print(
                batch.interactions_df[
                    ["episode", "turn", "prompt_preview", "reply_preview", "reward", "reward_discounted"]
                ]
                .head(8)
                .to_string(index=False)
            )
    wall = time.perf_counter() - t0
    summary = _summary(history, first, last, turns, wall, args)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot_curve(
        history,
        before,
        after,
        out / "reward_curve.png",
        agent=(agent_before, agent_after, turns),
        title=f"areal_nb demo: {cfg.experiment_name} GRPO on {cfg.model.path}",
    )
    print(
        f"\nreward first 5 steps {summary['reward_first5']:.3f} -> last 5 steps {summary['reward_last5']:.3f}"
    )
    print(
        f"accuracy {before:.3f} -> {after:.3f} (first reply), {agent_before:.3f} -> {agent_after:.3f} "
        f"(within {turns} turns); wall {wall:.0f} s; wrote {out / 'summary.json'} and "
        f"{out / 'reward_curve.png'}"
    )
    return 0


def _summary(
    history: Any, first: Any, last: Any, turns: int, wall: float, args: argparse.Namespace
) -> dict[str, Any]:
    """What `summary.json` records: the reward per step, the greedy evaluations before (`first`)
    and after (`last`) training, the worst log-prob gap and the run's wall time and config."""
    rewards = [float(r) for r in history["reward_mean"]]
    k = min(5, len(rewards))
    return {
        "steps": len(rewards),
        "reward_per_step": rewards,
        "reward_first5": sum(rewards[:k]) / k if k else None,
        "reward_last5": sum(rewards[-k:]) / k if k else None,
        "accuracy_before": first.accuracy,  # greedy, first reply only
        "accuracy_after": last.accuracy,
        "agent_turns": turns,
        "agent_accuracy_before": first.agent_accuracy,  # greedy, the agent's loop: solved within agent_turns
        "agent_accuracy_after": last.agent_accuracy,
        "eval_problems": first.n,
        "eval_reward_before": first.reward_mean,  # mean episode return of the greedy agent
        "eval_reward_after": last.reward_mean,
        # engine-recorded vs the trainer's recomputed log-probs of the same tokens, worst step
        "logprob_abs_diff_max": _column_max(history, "logprob_abs_diff_max"),
        "wall_s": wall,
        "config": str(args.config),
        "overrides": args.overrides,
    }


def _column_max(history, column: str) -> float | None:
    values = history[column].dropna() if column in history else ()
    return float(max(values)) if len(values) else None

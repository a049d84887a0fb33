"""A structured-output task trained with the sampled distributions replayed, and without.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/structured_learning.py [--steps 20] [--seeds 1 2 3]
        [--eval-size 100] [--out runs/structured] [override ...]

The agent answers the math task's questions (`configs/multi_turn_math.yaml`'s generated
problems, the given dotted overrides applied) as `{"answer": <int>}`: one OpenAI-SDK call per
episode with `response_format` a JSON schema, reward 1.0 when the integer is the gold answer.
Every reply is sampled under the schema's grammar, so each recorded token knows the masked
distribution it came from. Two variants train from the same start, seed by seed:

- "replay": `actor.replay_sampling_masks=true`, the trainer's log-probs renormalised over each
  token's allowed set (π_behave and π_θ of the distribution actually sampled);
- "full": `false`, log-probs over the whole vocabulary (the recorded full-vocabulary value as
  π_behave, the trainer's recomputation without the mask as π_θ).

Per run: held-out greedy accuracy before and after (the same problems; the evaluation samples
under the grammar too), the training reward's first and last 5-step means, and the mean over
steps of the trainer's |recorded − recomputed| log-prob (`mismatch_logp_abs_diff`, which with
replay is against the masked record). Then, per seed, the gain with replay minus the gain
without. The last line is one JSON object with every run. Timings are not the point here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
ANSWER_SCHEMA = {
    "type": "object",
    # bounded, so that an untrained model cannot write digits until max_new_tokens
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["answer"],
    "additionalProperties": False,
}
VARIANTS = {"replay": ["actor.replay_sampling_masks=true"], "full": ["actor.replay_sampling_masks=false"]}


def gold_answer(row: dict[str, Any]) -> str:
    """The integer after GSM8K's `####` (the generated task's answers are worked solutions)."""
    return str(row["answer"]).rsplit("####", 1)[-1].strip()


class JSONAnswerAgent:
    """One chat call answered as `{"answer": <int>}`; 1.0 when it is the gold answer."""

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        reply = await client.chat.completions.create(
            model="m",
            messages=data["messages"],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
            },
        )
        try:
            answer = json.loads(reply.choices[0].message.content or "")["answer"]
        except (ValueError, KeyError, TypeError):  # cut at max_new_tokens: not an answer
            return 0.0
        return float(str(answer) == gold_answer(data))


def run_one(overrides: list[str], steps: int, eval_size: int, out: Path, name: str) -> dict[str, Any]:
    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(
        CONFIG,
        [
            *overrides,
            f"total_steps={steps}",
            f"data.eval_size={eval_size}",
            "logging.eval_every=0",
            "logging.progress=false",
            f"logging.run_dir={out / name}",
        ],
    )
    with Session(cfg, agent__workflow=JSONAnswerAgent()) as session:
        before = session.evaluate()
        history = session.run(steps)
        after = session.evaluate()
    history.to_csv(out / f"{name}.csv", index=False)
    rewards = [float(r) for r in history["reward_mean"]]
    k = min(5, len(rewards))
    mismatch = [float(v) for v in history.get("mismatch_logp_abs_diff", []) if v == v]
    return {
        "name": name,
        "overrides": overrides,
        "accuracy_before": before.reward_mean,
        "accuracy_after": after.reward_mean,
        "gain_points": 100 * (after.reward_mean - before.reward_mean),
        "reward_first5": sum(rewards[:k]) / k,
        "reward_last5": sum(rewards[-k:]) / k,
        "mismatch_logp_abs_diff_mean": sum(mismatch) / len(mismatch) if mismatch else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (the demo trains 60)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-size", type=int, default=100, help="held-out problems evaluated")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("runs/structured"))
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. rollout.batch_size=8")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    runs = []
    for seed in args.seeds:
        for variant in args.variants:
            name = f"{variant}_seed{seed}"
            result = run_one(
                [*args.overrides, f"seed={seed}", *VARIANTS[variant]],
                args.steps,
                args.eval_size,
                args.out,
                name,
            )
            runs.append(result)
            print(
                f"{name}: held-out {100 * result['accuracy_before']:.1f} -> {100 * result['accuracy_after']:.1f} "
                f"({result['gain_points']:+.1f} points), reward first5 {result['reward_first5']:.3f} "
                f"last5 {result['reward_last5']:.3f}, mean |Δ log p| {result['mismatch_logp_abs_diff_mean']}",
                flush=True,
            )
    by_name = {run["name"]: run for run in runs}
    for seed in args.seeds:
        replay, full = by_name.get(f"replay_seed{seed}"), by_name.get(f"full_seed{seed}")
        if replay and full:
            print(
                f"seed {seed}: gain with replay {replay['gain_points']:+.1f} points, without "
                f"{full['gain_points']:+.1f} (difference {replay['gain_points'] - full['gain_points']:+.1f})"
            )
    print(json.dumps({"steps": args.steps, "eval_size": args.eval_size, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GRPO step cost on the demo config: rollout and training time and tokens/s per step, and how
many tokens `concat` rows train on compared with `individual` rows of the same episodes.

    .venv/bin/python benchmarks/grpo_step.py [--steps 3] [overrides ...]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi_turn_math.yaml"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(args.config, [*args.overrides, "logging.progress=false", "rollout.prefetch=false"])
    rows = []
    with Session(cfg) as session:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = session.rollout()
            t1 = time.perf_counter()
            concat = batch.reexport(style="concat").to_tensors()
            individual = batch.reexport(style="individual").to_tensors()
            stats = session.train_step(batch)
            t2 = time.perf_counter()
            rows.append({
                "rollout_s": t1 - t0,
                "train_s": t2 - t1,
                "rollout_tokens_per_s": stats["rollout_tokens_per_s"],
                "train_tokens_per_s": stats["train_tokens_per_s"],
                "episodes": len(batch.episodes),
                "concat_rows": int(concat["input_ids"].shape[0]),
                "individual_rows": int(individual["input_ids"].shape[0]),
                "concat_tokens": int(concat["attention_mask"].sum()),
                "individual_tokens": int(individual["attention_mask"].sum()),
            })
            print(json.dumps(rows[-1]))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratio = sum(r["concat_tokens"] for r in rows) / sum(r["individual_tokens"] for r in rows)
    print(f"rollout {med['rollout_s']:.2f} s/step ({med['rollout_tokens_per_s']:.0f} generated tok/s), "
          f"train {med['train_s']:.2f} s/step ({med['train_tokens_per_s']:.0f} tok/s); "
          f"concat rows hold {ratio:.2f}x the tokens of individual rows (baseline: individual)")
    print(json.dumps({"rollout_s": med["rollout_s"], "train_s": med["train_s"],
                      "rollout_tokens_per_s": med["rollout_tokens_per_s"],
                      "train_tokens_per_s": med["train_tokens_per_s"],
                      "concat_vs_individual_tokens": ratio}))


if __name__ == "__main__":
    main()

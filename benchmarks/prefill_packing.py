"""Prefill CPU time: packed forwards (`engine/packed_prefill.py`) vs padded forwards over groups of
similar length (`length_groups`, what the lean forward did before and the stock forward still does).

Both run through the same `PaddedKVBatch` with the same lean Qwen2 forward, on the prompts of
`benchmarks/engine_throughput.py` (8-64 random tokens each), alternating, best of --repeats by
process CPU time (set OMP_NUM_THREADS=1 on a shared machine). The padded baseline copies its groups'
keys/values into the batch rows once more than it used to (a few % of its time).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/prefill_packing.py [--requests 8 32 128]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from areal_nb.engine.kv_batch import JoiningRows, PaddedKVBatch  # noqa: E402
from areal_nb.engine.weights import load_engine_model  # noqa: E402
from areal_nb.models.cache import cache_root  # noqa: E402
from benchmarks.engine_throughput import BENCH_QWEN2, build_bench_qwen2  # noqa: E402


def prefill_cpu(batch: PaddedKVBatch, prompts: list[list[int]], packed: bool) -> float:
    batch.clear()
    fill = batch._prefill_packed if packed else batch._prefill_stock  # noqa: SLF001 - the two paths compared
    start = time.process_time()
    every = list(range(len(prompts)))
    fill(JoiningRows(prompts, [None] * len(prompts), [0] * len(prompts), every, list(every)))
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model_dir = build_bench_qwen2(cache_root() / "bench" / BENCH_QWEN2)
    model, _ = load_engine_model(model_dir, None, torch.device("cpu"), torch.float32)
    batch = PaddedKVBatch(model)
    assert batch.fast is not None
    rows = {}
    with torch.inference_mode():
        for n in args.requests:
            rng = random.Random(n)
            prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(8, 64))] for _ in range(n)]
            best = {"packed": float("inf"), "padded": float("inf")}
            for _ in range(args.repeats):
                for name in best:
                    best[name] = min(best[name], prefill_cpu(batch, prompts, name == "packed"))
            tokens = sum(map(len, prompts))
            rows[n] = {
                "tokens": tokens,
                **{f"{k}_ms": round(v * 1e3, 1) for k, v in best.items()},
                "packed_over_padded": round(best["packed"] / best["padded"], 2),
            }
            print(
                f"  N={n:4d} ({tokens} prompt tokens): packed {best['packed'] * 1e3:7.1f} ms, padded groups "
                f"{best['padded'] * 1e3:7.1f} ms CPU = {rows[n]['packed_over_padded']:.2f}x",
                flush=True,
            )
    print(json.dumps({"load_average": os.getloadavg()[0], "by_requests": rows}))


if __name__ == "__main__":
    main()

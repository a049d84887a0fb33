"""LoRA on the embedded engine: base + ΔW merged into a copy of its own (`merged`) against the
trainer's base and adapter tensors served in place (`in_place`, `engine/in_place_lora.py`).

Each way runs in a fresh process: the policy (float32, CPU) is loaded as a Session loads it,
the engine is made from it (`merged`: its own copy, `share_weights=False`; `in_place`: sharing
the policy's tensors, `Actor.serve_in_place`), and an Actor wraps the policy with LoRA (rank
--r, alpha 2r, every linear layer). The adapters' B is set to small random values (a trained
adapter, so ΔW is not zero), the engine is pushed them and decodes once (its lean forward's
copies built). Then, per way:

- resident memory (VmRSS) after that warm-up, after --pushes pushes, and the peak (VmHWM);
- the wall time of one push (`Actor.push_weights` after the adapters changed in place, as an
  optimizer step changes them; `in_place`: while the engine is paused, as a train step does),
  and of the push plus the first token after it (one request, one new token: the lean forward
  rebuilds its fused, prepacked copies of the merged weights at the first step after a merged
  push), medians of --pushes;
- decoding: --requests N concurrent requests of random prompts (32-64 ids) × --new-tokens
  (temperature 1, ignore_eos), best of --repeats: output tok/s and output tokens per CPU second
  of the process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/lora_in_place.py [--model shape|smollm2|FOLDER]
        [--layers 30] [--r 16] [--requests 8 32] [--new-tokens 64] [--pushes 5] [--repeats 3] [--stock]

`--stock`: the engine's stock transformers forward (`fast_forward=False`) instead of the lean one.

`shape` (default) is a random-weight Llama of SmolLM2-135M's shape (`engine_memory.py`), `smollm2`
SmolLM2-135M-Instruct itself (its GGUF file, converted once; 6 GB a process at its peak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WAYS = ("merged", "in_place")


def rss_gb(field: str = "VmRSS:") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 2**20
    return 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def model_folder(name: str, layers: int) -> str:
    if name == "shape":
        from engine_memory import smollm2_shape_folder

        return str(smollm2_shape_folder(Path("/tmp/areal_nb_bench_models"), layers))  # (as engine_memory's)
    if name == "smollm2":
        from real_model_tutorial import smollm2_gguf

        from areal_nb.models import resolve_model_path

        return str(resolve_model_path(str(smollm2_gguf())))
    return name


def decode(engine, n: int, new_tokens: int, seed: int) -> tuple[float, float, int]:
    """(wall s, process CPU s, output tokens) of n concurrent requests."""
    from areal_nb.api import GenerationConfig, ModelRequest

    rng = random.Random(seed)
    reqs = [
        ModelRequest(
            input_ids=[rng.randrange(3, engine.vocab_size) for _ in range(rng.randint(32, 64))],
            gconfig=GenerationConfig(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True),
        )
        for _ in range(n)
    ]

    async def all_at_once():
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    wall, cpu = time.perf_counter(), cpu_seconds()
    responses = asyncio.run(all_at_once())
    return time.perf_counter() - wall, cpu_seconds() - cpu, sum(len(r.output_tokens) for r in responses)


def one_way(way: str, args) -> dict:
    import torch

    from areal_nb.engine import LocalEngine
    from areal_nb.models import load_model
    from areal_nb.train import Actor, GRPOConfig
    from areal_nb.train.lora import LoraConfig, is_adapter_key

    folder = model_folder(args.model, args.layers)
    policy = load_model(folder, dtype=torch.float32, device="cpu")
    loaded = rss_gb()
    in_place = way == "in_place"
    engine = LocalEngine(
        policy,
        device="cpu",
        max_batch_size=max(args.requests),
        share_weights=in_place,
        seed=0,
        fast_forward=not args.stock,
    )
    lora = LoraConfig(r=args.r, alpha=2.0 * args.r, target_modules="all-linear")
    actor = Actor(policy, GRPOConfig(lora=lora), version=0)
    if in_place:
        actor.serve_in_place(engine)
    assert engine.shares_weights == in_place
    adapters = [p for n, p in actor.model.named_parameters() if is_adapter_key(n)]
    gen = torch.Generator().manual_seed(0)

    def train_like_step() -> None:  # what an optimizer step does to the adapters: in place
        with torch.no_grad():
            for p in adapters:
                p.add_(torch.randn(p.shape, generator=gen) * 1e-3)

    version = 0

    def push() -> float:
        nonlocal version
        version += 1
        if in_place:  # as a train step: the engine paused while the adapters change
            engine.pause()
        try:
            train_like_step()
            start = time.perf_counter()
            actor.push_weights(engine, version)
            took = time.perf_counter() - start
        finally:
            if in_place:
                engine.resume()
        return took

    push()
    decode(engine, 8, 8, seed=99)  # warm-up: every copy the engine keeps is built
    warm = rss_gb()
    pushes, to_token = [], []
    for _ in range(args.pushes):
        pushes.append(push())
        start = time.perf_counter()
        decode(engine, 1, 1, seed=98)
        to_token.append(pushes[-1] + time.perf_counter() - start)
    after_pushes = rss_gb()
    runs: dict[str, dict] = {}
    for n in args.requests:
        best = None
        for repeat in range(args.repeats):
            wall, cpu, tokens = decode(engine, n, args.new_tokens, seed=repeat)
            if best is None or wall < best[0]:
                best = (wall, cpu, tokens)
        assert best is not None
        wall, cpu, tokens = best
        runs[str(n)] = {"tok_s": round(tokens / wall, 1), "tok_per_cpu_s": round(tokens / cpu, 1)}
    engine.close()
    return {
        "way": way,
        "rss_loaded_gb": round(loaded, 3),
        "rss_warm_gb": round(warm, 3),
        "rss_after_pushes_gb": round(after_pushes, 3),
        "peak_rss_gb": round(rss_gb("VmHWM:"), 3),
        "push_s_median": round(statistics.median(pushes), 4),
        "push_and_first_token_s_median": round(statistics.median(to_token), 4),
        "decode": runs,
        "fast_forward": engine._batch.fast is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="shape", help="shape, smollm2 or a model folder")
    parser.add_argument("--layers", type=int, default=30, help="decoder layers of the shape model")
    parser.add_argument("--r", type=int, default=16)
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="the stock forward, not the lean one")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # (a child process)
    args = parser.parse_args()
    if args.way:
        print(json.dumps(one_way(args.way, args)), flush=True)
        return
    results = {}
    for way in WAYS:
        child = [sys.executable, __file__, *sys.argv[1:], "--way", way]
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        results[way] = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(results[way]), flush=True)
    merged, shared = results["merged"], results["in_place"]
    print(
        f"RSS warm {merged['rss_warm_gb']:.2f} -> {shared['rss_warm_gb']:.2f} GB, peak "
        f"{merged['peak_rss_gb']:.2f} -> {shared['peak_rss_gb']:.2f} GB; push "
        f"{merged['push_s_median'] * 1e3:.1f} -> {shared['push_s_median'] * 1e3:.1f} ms, with the first token "
        f"after it {merged['push_and_first_token_s_median'] * 1e3:.1f} -> "
        f"{shared['push_and_first_token_s_median'] * 1e3:.1f} ms (medians); decode tok/s "
        + ", ".join(
            f"N={n}: {merged['decode'][n]['tok_s']} -> {shared['decode'][n]['tok_s']} (per CPU s "
            f"{merged['decode'][n]['tok_per_cpu_s']} -> {shared['decode'][n]['tok_per_cpu_s']})"
            for n in merged["decode"]
        )
        + f"; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()

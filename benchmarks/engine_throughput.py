"""LocalEngine throughput vs. plain `model.generate`, on the same model in the same run.

N concurrent requests with different prompt lengths and different output lengths (each its own
max_new_tokens in [8, 64], ignore_eos so every run produces the same number of tokens), sampled at
temperature 1, served three ways:
  engine      LocalEngine, all N submitted at once (continuous batching)
  one_by_one  `model.generate` per request, sequentially
  static      one left-padded `model.generate` call over all N (every row runs to the longest)
  remote      (with --remote) the same N requests through `SGLangEngine` to an `areal-nb engine-server`
              subprocess (same model, batch size and seed) over HTTP on loopback; `ratio_remote` is
              remote / engine, the cost of the HTTP hop and the JSON (target >= 0.85 at 32 requests)
Each way runs --repeats times (interleaved) and the best time counts: the shared 2-core machine is
noisy. Throughput counts the tokens the requests asked for (the static batch's extra tokens past a row's
own limit are waste, not output). The last line printed is one JSON object; `ratio` and
`ratio_static` are for the first --requests value.

    python benchmarks/engine_throughput.py --model tiny-math --requests 32 128
    python benchmarks/engine_throughput.py --requests 32 --remote
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

import torch

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.models import resolve_model_path


def make_requests(n: int, vocab: int, rng: random.Random, args) -> list[ModelRequest]:
    return [
        ModelRequest(
            input_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))],
            gconfig=GenerationConfig(
                max_new_tokens=rng.randint(args.min_new, args.max_new), temperature=1.0, ignore_eos=True
            ),
        )
        for _ in range(n)
    ]


# CPU seconds of the latest run of each way (the machine is shared: CPU time is the steadier figure)
CPU_SECONDS: dict[str, float] = {}


def process_cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_engine(engine: LocalEngine, reqs: list[ModelRequest]) -> tuple[float, int]:
    async def all_at_once():
        return await asyncio.gather(*(engine.agenerate(r.copy()) for r in reqs))

    cpu = time.process_time()
    start = time.perf_counter()
    responses = asyncio.run(all_at_once())
    elapsed = time.perf_counter() - start
    CPU_SECONDS["engine"] = time.process_time() - cpu
    assert all(r.output_len == q.gconfig.max_new_tokens for r, q in zip(responses, reqs, strict=True))
    return elapsed, sum(r.output_len for r in responses)


def run_remote(remote, reqs: list[ModelRequest]) -> tuple[float, int]:
    async def all_at_once():
        return await asyncio.gather(*(remote.agenerate(r.copy()) for r in reqs))

    server_pid = remote.owned_processes[0].pid
    cpu, server_cpu = time.process_time(), process_cpu_seconds(server_pid)
    start = time.perf_counter()
    responses = asyncio.run(all_at_once())
    elapsed = time.perf_counter() - start
    CPU_SECONDS["remote_client"] = time.process_time() - cpu
    CPU_SECONDS["remote_server"] = process_cpu_seconds(server_pid) - server_cpu
    assert all(r.output_len == q.gconfig.max_new_tokens for r, q in zip(responses, reqs, strict=True))
    return elapsed, sum(r.output_len for r in responses)


def start_remote(args):
    """An engine-server subprocess with the benchmark's settings, and an SGLangEngine over it."""
    from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port
    from areal_nb.engine.remote import SGLangEngine

    port = free_port()
    cmd = engine_server_command(args.model, port=port, extra_args=[
        "--max-batch-size", str(args.max_batch_size), "--seed", str(args.seed)])
    proc = ServerProcess(cmd, f"http://127.0.0.1:{port}").start()
    proc.wait_ready(timeout=600)
    return proc, SGLangEngine([proc.url], owned_processes=[proc])


def _sampling_kwargs(n_new: int) -> dict:
    # min_new_tokens = max_new_tokens: EOS cannot end a row early (the ignore_eos of generate)
    return dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n_new, min_new_tokens=n_new)


@torch.inference_mode()
def run_one_by_one(model, reqs: list[ModelRequest], pad_id: int) -> tuple[float, int]:
    start = time.perf_counter()
    produced = 0
    for r in reqs:
        n_new = r.gconfig.max_new_tokens
        out = model.generate(torch.tensor([r.input_ids]), pad_token_id=pad_id, **_sampling_kwargs(n_new))
        produced += out.shape[1] - len(r.input_ids)
    return time.perf_counter() - start, produced


@torch.inference_mode()
def run_static_batch(model, reqs: list[ModelRequest], pad_id: int) -> tuple[float, int]:
    width = max(len(r.input_ids) for r in reqs)
    ids = torch.full((len(reqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(reqs), width), dtype=torch.long)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.input_ids) :] = torch.tensor(r.input_ids)
        mask[i, width - len(r.input_ids) :] = 1
    longest = max(r.gconfig.max_new_tokens for r in reqs)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, pad_token_id=pad_id, **_sampling_kwargs(longest))
    elapsed = time.perf_counter() - start
    assert out.shape[1] - width == longest
    return elapsed, sum(r.gconfig.max_new_tokens for r in reqs)  # useful tokens only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-math")
    parser.add_argument("--requests", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--remote", action="store_true", help="also serve through engine-server over HTTP")
    parser.add_argument("--only", nargs="+", default=None, help="subset of ways to run, e.g. engine remote")
    args = parser.parse_args()

    engine = LocalEngine(resolve_model_path(args.model), max_batch_size=args.max_batch_size, seed=args.seed)
    # The baselines use the engine's own weights, so all three serve the same model.
    model, pad_id = engine.model, engine.tokenizer.pad_token_id or 0
    rng = random.Random(args.seed)
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
          f"torch threads {torch.get_num_threads()}, device {engine.device}")

    remote = None
    if args.remote:
        _proc, remote = start_remote(args)
    warm = make_requests(4, engine.vocab_size, rng, args)
    run_engine(engine, warm)
    run_one_by_one(model, warm[:1], pad_id)
    run_static_batch(model, warm, pad_id)
    if remote is not None:
        run_remote(remote, warm)

    results: dict[str, dict] = {}
    for n in args.requests:
        reqs = make_requests(n, engine.vocab_size, rng, args)
        before = (engine.stats.decode_steps, engine.stats.max_active)
        engine.stats.max_active = 0
        row: dict[str, float | int] = {"requests": n, "output_tokens": sum(r.gconfig.max_new_tokens for r in reqs)}
        ways = {
            "engine": lambda: run_engine(engine, reqs),
            "one_by_one": lambda: run_one_by_one(model, reqs, pad_id),
            "static": lambda: run_static_batch(model, reqs, pad_id),
        }
        if remote is not None:
            ways["remote"] = lambda: run_remote(remote, reqs)
        if args.only:
            ways = {k: v for k, v in ways.items() if k in args.only}
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeats):
            for name, fn in ways.items():
                elapsed, tokens = fn()
                if name not in best or elapsed < best[name][0]:
                    best[name] = (elapsed, tokens)
                    for key, value in CPU_SECONDS.items():
                        if key.startswith(name):
                            row[f"{key}_cpu_s"] = round(value, 3)
        for name, (elapsed, tokens) in best.items():
            row[f"{name}_s"] = round(elapsed, 3)
            row[f"{name}_tok_s"] = round(tokens / elapsed, 1)
            print(f"  N={n:4d} {name:<11s} {tokens:6d} tokens in {elapsed:7.2f} s = {tokens / elapsed:9.1f} tok/s "
                  f"(best of {args.repeats})", flush=True)
        row["engine_decode_steps"] = (engine.stats.decode_steps - before[0]) // args.repeats
        row["engine_max_active"] = engine.stats.max_active
        for key, other in (("ratio", "one_by_one"), ("ratio_static", "static")):
            if f"{other}_tok_s" in row and "engine_tok_s" in row:
                row[key] = round(row["engine_tok_s"] / row[f"{other}_tok_s"], 2)
        if "remote_tok_s" in row and "engine_tok_s" in row:
            row["ratio_remote"] = round(row["remote_tok_s"] / row["engine_tok_s"], 2)
            # CPU the server spent on the same tokens vs the embedded engine (client CPU reported apart)
            row["ratio_remote_cpu"] = round(row["engine_cpu_s"] / row["remote_server_cpu_s"], 2)
        print(f"  N={n:4d} " + ", ".join(f"{k} = {row[k]:.2f}x" for k in ("ratio", "ratio_static", "ratio_remote")
                                       if k in row)
              + f" ({row['engine_decode_steps']} decode steps, up to {row['engine_max_active']} rows per step)",
              flush=True)
        results[str(n)] = row
    engine.close()
    if remote is not None:
        remote.close()  # stops the engine-server it owns

    first = results[str(args.requests[0])]
    summary = {k: first[k] for k in ("ratio", "ratio_static", "ratio_remote", "ratio_remote_cpu") if k in first}
    print(json.dumps({"model": args.model, **summary, "by_requests": results}))


if __name__ == "__main__":
    main()

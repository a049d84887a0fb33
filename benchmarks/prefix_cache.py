"""The engine's prefix cache on the multi-turn demo's shape of work, cache on vs off in one run.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_cache.py [--prompts 16] [--samples 8] [--repeats 5]

(On a shared machine keep OMP_NUM_THREADS=1, or OMP_WAIT_POLICY=PASSIVE: with torch's default
spinning OpenMP threads a decoding step took 50x longer at load 9.)

`LocalEngine` on tiny-math, without the proxy or training: each of prompts x samples conversations
sends its first turn (a chat-templated question, 16 new tokens at temperature 1), and as soon as
that finishes its second turn, the `concat` template's continuation: the first turn's tokens, EOS,
and the templated correction message `MultiTurnMathAgent` sends (every conversation continues
here; in the demo those answering right stop). "cache" is the default engine, "nocache" the same
with `prefix_cache_tokens=0`; both compute identical prompts of one admission once. Runs alternate
(cache, nocache, cache, ...; a fresh engine each, same seed) and the median counts. Figures:
wall seconds, the engine worker's CPU seconds inside its scheduler steps (`engine_cpu_s`, robust
on a shared machine), prefill positions computed, prefix cache hits; then cache / nocache ratios.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def conversations(tokenizer: Any, n_prompts: int) -> tuple[list[list[int]], list[int]]:
    """First-turn prompts of `n_prompts` generated problems, and the tokens a second turn appends
    after the first turn's reply and EOS (the correction message, templated)."""
    from areal_nb.agents.math_agent import CORRECTION_PROMPT
    from areal_nb.data import generate_problems

    rows = generate_problems(n_prompts, seed=0)
    prompts = [
        tokenizer.apply_chat_template(
            r["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in rows
    ]
    full = tokenizer.apply_chat_template(
        [
            *rows[0]["messages"],
            {"role": "assistant", "content": "0"},
            {"role": "user", "content": CORRECTION_PROMPT},
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    eos = tokenizer.eos_token_id
    first_eos = full.index(eos, len(prompts[0]))  # the end of the assistant's reply
    return [list(p) for p in prompts], list(full[first_eos + 1 :])


def run_once(
    model_path: str,
    tokenizer: Any,
    prompts: list[list[int]],
    suffix: list[int],
    samples: int,
    cache_tokens: int,
) -> dict[str, float]:
    from areal_nb.api import GenerationConfig, ModelRequest
    from areal_nb.engine import LocalEngine

    engine = LocalEngine(
        model_path, tokenizer, device="cpu", seed=0, max_batch_size=128, prefix_cache_tokens=cache_tokens
    )
    cpu = [0.0]
    step = engine._step

    def timed_step(*args: Any) -> Any:  # runs on the engine's worker thread
        start = time.thread_time()
        try:
            return step(*args)
        finally:
            cpu[0] += time.thread_time() - start

    engine._step = timed_step
    gconfig = GenerationConfig(max_new_tokens=16, temperature=1.0)
    eos = tokenizer.eos_token_id

    async def conversation(prompt: list[int]) -> None:
        first = await engine.agenerate(ModelRequest(list(prompt), gconfig))
        reply = [t for t in first.output_tokens if t != eos]
        await engine.agenerate(ModelRequest(list(prompt) + reply + [eos] + suffix, gconfig))

    async def all_conversations() -> None:
        await asyncio.gather(*(conversation(p) for p in prompts for _ in range(samples)))

    try:
        start = time.perf_counter()
        asyncio.run(all_conversations())
        wall = time.perf_counter() - start
        stats = engine.stats
        return {
            "wall_s": wall,
            "engine_cpu_s": cpu[0],
            "prefill_positions": stats.prefill_positions,
            "prompt_tokens": stats.prompt_tokens,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "prefix_cache_tokens": stats.prefix_cache_tokens,
            "decode_steps": stats.decode_steps,
        }
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from areal_nb.models import load_tokenizer, resolve_model_path

    model_path = str(resolve_model_path("tiny-math"))
    tokenizer = load_tokenizer("tiny-math")
    prompts, suffix = conversations(tokenizer, args.prompts)
    modes = {"cache": 32768, "nocache": 0}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for mode, tokens in modes.items():
                runs[mode].append(run_once(model_path, tokenizer, prompts, suffix, args.samples, tokens))
    result: dict[str, Any] = {"requests": 2 * args.prompts * args.samples, "suffix_tokens": len(suffix)}
    for mode, rows in runs.items():
        result[mode] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        m = result[mode]
        print(
            f"{mode:>8}: wall {m['wall_s']:.2f} s, engine CPU {m['engine_cpu_s']:.2f} s, prefill positions "
            f"{m['prefill_positions']:.0f} of {m['prompt_tokens']:.0f} prompt tokens, prefix cache hits "
            f"{m['prefix_cache_hits']:.0f} ({m['prefix_cache_tokens']:.0f} tokens)"
        )
    for key in ("wall_s", "engine_cpu_s", "prefill_positions"):
        result[f"{key}_cache_over_nocache"] = result["cache"][key] / result["nocache"][key]
    print(
        f"cache / nocache: wall {result['wall_s_cache_over_nocache']:.2f}x, engine CPU "
        f"{result['engine_cpu_s_cache_over_nocache']:.2f}x, prefill positions "
        f"{result['prefill_positions_cache_over_nocache']:.2f}x; load average {os.getloadavg()[0]:.1f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Peak resident memory of `LocalEngine` serving N concurrent requests, at SmolLM2-135M's shape.

A Llama model of SmolLM2-135M-Instruct's configuration (30 layers, hidden 576, 9 query / 3
key-value heads, vocabulary 49,152, tied embeddings; random weights and the stand-in tokenizer of
`gpu_check.py`: memory does not depend on their values, so no download) or the folder given by --model, in float32, on CPU. For each N a
fresh process loads the engine, then sends N requests at once (prompts of --min-prompt to
--max-prompt random ids, --new-tokens each, temperature 1, ignore_eos) and reports its resident
memory after loading and its peak (VmHWM) over the whole run. The KV those requests hold at the
end is printed beside it: the part of the peak the work itself needs.

    python benchmarks/engine_memory.py --requests 8 32 [--model FOLDER] [--limit-gb 6]

Memory figures only: they hold on a busy machine; timings would not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def smollm2_shape_folder(cache: Path, layers: int = 30) -> Path:
    """A random-weight Llama of SmolLM2-135M's shape (`layers` decoder layers) saved under `cache`."""
    folder = cache / f"smollm2-135m-shape-{layers}l"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from gpu_check import standin_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers}), dtype=torch.float32
    )
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    standin_tokenizer(SMOLLM2_135M["vocab_size"]).save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def one_run(folder: str, n: int, args) -> dict:
    import torch

    from areal_nb.api import GenerationConfig, ModelRequest
    from areal_nb.engine import LocalEngine

    torch.set_num_threads(2)
    engine = LocalEngine(folder, tokenizer=None, device="cpu", dtype=torch.float32, max_batch_size=max(n, 1))
    loaded = rss_gb()
    vocab = engine.vocab_size
    rng = random.Random(0)
    reqs = [
        ModelRequest(
            input_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))],
            gconfig=GenerationConfig(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True),
        )
        for _ in range(n)
    ]

    async def all_at_once():
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    responses = asyncio.run(all_at_once())
    cfg = engine.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    tokens = sum(len(r.input_tokens) + len(r.output_tokens) for r in responses)
    kv_gb = tokens * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4 / 2**30
    engine.close()
    return {
        "requests": n,
        "rss_loaded_gb": round(loaded, 2),
        "peak_rss_gb": round(peak_gb(), 2),
        "kv_of_all_tokens_gb": round(kv_gb, 3),
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--model", default=None, help="a save_pretrained folder (default: SmolLM2-135M shape, random)"
    )
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--limit-gb", type=float, default=6.0, help="address-space cap of each run (ulimit -v)"
    )
    parser.add_argument("--cache", default="/tmp/areal_nb_bench_models")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = args.model or str(smollm2_shape_folder(Path(args.cache), args.layers))
    if args.one is not None:
        print(json.dumps(one_run(folder, args.one, args)), flush=True)
        return
    rows = []
    for n in args.requests:
        cmd = [sys.executable, __file__, "--one", str(n), "--model", folder]
        cmd += ["--min-prompt", str(args.min_prompt), "--max-prompt", str(args.max_prompt)]
        cmd += ["--new-tokens", str(args.new_tokens)]
        limit = int(args.limit_gb * 2**30)

        def cap(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        # RLIMIT_AS counts address space, not RSS: torch's thread stacks and mappings take some
        # GB of it, so the cap is a guard against runaway growth, not the measurement.
        out = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cap, env=os.environ)
        if out.returncode != 0:
            rows.append({"requests": n, "error": out.stderr.strip().splitlines()[-1:]})
        else:
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"model": folder, "runs": rows}))


if __name__ == "__main__":
    main()

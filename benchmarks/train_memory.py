"""Peak memory of one GRPO train step with the log-softmax chunked by tokens vs all at once.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/train_memory.py [--rows 64] [--tokens 256] [--generated 32]

The model is Qwen2.5-0.5B-shaped with 2 decoder layers (random init, float32 on the CPU):
vocabulary 151,936, hidden 896, 14 heads, 2 key/value heads, MLP 4864, tied embeddings. The
batch: `rows` rows of `tokens` tokens in GRPO groups of 8 that share their prompt, the last
`generated` tokens of each row generated (the loss reads log-probs there). Each variant runs in
its own process (`--variant`, run by the parent): it builds the model and the batch, resets the
process's peak resident memory (/proc/self/clear_refs), takes one `Actor.train_step`, and reports
the peak (VmHWM) and the loss. The parent prints both, their ratio, and checks that the losses
are equal within 1e-6 (and prints the entropies' and gradient norms' differences: on-policy the
loss is -mean(advantage) whatever the log-probs, the gradient is not). "unchunked" is `actor.logprob_chunk_size=0` (the whole micro-batch's
float32 [positions, vocabulary] log-softmax at once), "chunked" the default (1024 tokens).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from areal_nb.api.train_batch import TrainBatch

GROUP = 8
VARIANTS = {"unchunked": 0, "chunked": 1024}


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_variant(chunk: int, rows: int, tokens: int, generated: int) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from areal_nb.train import Actor, GRPOConfig

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    prompt_len = tokens - generated
    ids = []
    for _ in range(rows // GROUP):
        prompt = torch.randint(3, config.vocab_size, (prompt_len,))
        ids += [torch.cat([prompt, torch.randint(3, config.vocab_size, (generated,))]) for _ in range(GROUP)]
    input_ids = torch.stack(ids)
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[:, prompt_len:] = 1
    batch = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids, dtype=torch.bool),
        "loss_mask": loss_mask,
        "logprobs": torch.zeros(input_ids.shape),
        "rewards": torch.rand(rows),
    }
    actor = Actor(model, GRPOConfig(lr=1e-6, logprob_chunk_size=chunk))
    group_ids = [r // GROUP for r in range(rows)]
    before = peak_rss_bytes()
    try:  # peak from here on: the step, not the build
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    start = time.perf_counter()
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
    return {
        "peak_bytes": peak_rss_bytes(),
        "peak_before_step_bytes": before,
        "peak_reset": reset,
        "loss": stats["loss"],
        "entropy": stats["entropy"],
        "grad_norm": stats["grad_norm"],
        "seconds": time.perf_counter() - start,
        "train_positions": stats["train_positions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--generated", type=int, default=32)
    parser.add_argument(
        "--variant", choices=list(VARIANTS), help="(internal) run one variant in this process"
    )
    args = parser.parse_args()
    if args.rows % GROUP or not 0 < args.generated < args.tokens:
        parser.error(f"--rows must be a multiple of {GROUP} and 0 < --generated < --tokens")
    if args.variant:
        print(json.dumps(run_variant(VARIANTS[args.variant], args.rows, args.tokens, args.generated)))
        return
    results = {}
    for name in VARIANTS:  # one process each: a peak belongs to one variant only
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--variant",
                name,
                "--rows",
                str(args.rows),
                "--tokens",
                str(args.tokens),
                "--generated",
                str(args.generated),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[name]
        print(
            f"{name:>9}: peak RSS of the step {r['peak_bytes'] / 2**30:.2f} GiB (before it {r['peak_before_step_bytes'] / 2**30:.2f} GiB"
            f"{'' if r['peak_reset'] else ', peak not reset: whole process'}), loss {r['loss']:.9f}, "
            f"{r['seconds']:.1f} s, {r['train_positions']:.0f} positions",
            flush=True,
        )
    whole, chunked = results["unchunked"], results["chunked"]
    diff = abs(whole["loss"] - chunked["loss"])
    print(
        f"peak ratio unchunked / chunked: {whole['peak_bytes'] / chunked['peak_bytes']:.2f}x "
        f"({args.rows} rows x {args.tokens} tokens, {args.generated} generated per row)"
    )
    print(
        f"loss difference: {diff:.2e} ({'equal' if diff <= 1e-6 else 'NOT equal'} within 1e-6); "
        f"entropy difference {abs(whole['entropy'] - chunked['entropy']):.2e}; gradient norm relative difference "
        f"{abs(whole['grad_norm'] - chunked['grad_norm']) / whole['grad_norm']:.2e}"
    )
    if diff > 1e-6:
        sys.exit(1)


if __name__ == "__main__":
    main()

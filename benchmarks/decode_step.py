"""Where a LocalEngine decoding step's CPU time goes at N rows, and what attending only over each
row's own keys would save: the measurements behind the decoding-step note in docs/guides/cpu-engine.md.

Builds the engine's batch (`PaddedKVBatch`, lean forward) for N prompts of 8..64 random
tokens (as engine_throughput.py), runs --steps decoding steps, then times on ONE torch thread, in
CPU seconds (`time.process_time`: steadier than wall time on a shared machine), interleaved over
--repeats rounds (best round counts):
  step       a decoding step as the engine runs it (mean over the --steps steps)
  linears    the step's projections alone, same shapes (the arithmetic floor of the step)
  lm_head    the LM head alone (part of `linears`)
  sampling   what the engine does with the step's logits at temperature 1 (`sample_next_tokens`:
             log-softmax, the draw, the log-probs); not part of `step`
  attention  every layer's decoding attention over its whole buffer, as the engine does it: left
             padding and spare columns included (buffers as wide as the engine's, same mask)
  sliced     the same over views trimmed to the written columns (no spare columns; a view of a
             wider buffer)
  grouped    the same over --groups tight copies: rows sorted by length, each group's buffer only
             as wide as its longest row (the bytes a KV layout bucketed by length would read)
  grouped_step  a whole decoding step over such a layout, interleaved with `step` on the same
             prompts: --groups batches of rows of similar length (each with the engine's spare
             columns), projections over all rows at once, attention per group (`_grouped_decode`,
             a prototype of what that layout's step would run); its logits are checked against
             the engine's (< 1e-4)
Each variant's attention output is checked against the engine's (max abs diff printed, must be
< 1e-5). `valid` is the fraction of attended (row, column) pairs that hold a token of the row.
The attention-only figures overstate what a layout change would save: compare `grouped_step`
with `step`.

    python benchmarks/decode_step.py --rows 32 128
"""

from __future__ import annotations

import argparse
import json
import random
import time
from itertools import pairwise

import torch

from areal_nb.engine.kv_batch import PaddedKVBatch
from areal_nb.engine.lean_forward import _single_query_attention
from areal_nb.engine.sampling import SamplingParams, sample_next_tokens


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randint(8, 64))] for _ in range(n)]


def _buffers(batch: PaddedKVBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Contiguous copies of every layer's keys/values, as wide as the engine's buffers (zeros in
    the spare columns), built from the batch's public state."""
    out = []
    for layer in batch.cache.layers:
        keys, values = layer.keys, layer.values  # [B, kv_heads, length, D]
        k = keys.new_zeros(*keys.shape[:2], layer.capacity, keys.shape[3])
        v = torch.zeros_like(k)
        k[:, :, : keys.shape[2]] = keys
        v[:, :, : values.shape[2]] = values
        out.append((k, v))
    return out


def _mask(pads: torch.Tensor, start: int, stop: int, end: int, n_kv: int) -> torch.Tensor:
    """Additive mask [rows * n_kv, 1, stop - start] over columns [start, stop): -inf on padding
    (column < pad) and on unwritten columns (>= end)."""
    cols = torch.arange(start, stop)
    hidden = (cols[None, :] < pads[:, None]) | (cols >= end)[None, :]
    mask = torch.zeros(hidden.shape).masked_fill_(hidden, float("-inf"))
    return mask[:, None, None, :].expand(-1, n_kv, 1, -1).reshape(-1, 1, stop - start)


def _grouped_decode(lean, batches: list[PaddedKVBatch], tokens: torch.Tensor) -> torch.Tensor:
    """One decoding step over `batches` (row groups, in order): `LeanForward.decode`'s
    arithmetic with the projections over all rows at once and the attention per group."""
    n_q, dim = lean.n_heads, lean.head_dim
    masks, positions, bounds = [], [], [0]
    for batch in batches:
        batch._reserve_column()
        mask, position = batch._step_inputs(batch.cache.layers[0].capacity)
        masks.append(mask)
        positions.append(position)
        bounds.append(bounds[-1] + batch.size)
    rows = tokens.shape[0]
    hidden = lean.embed(tokens)
    cos, sin = lean.rope(hidden, torch.cat(positions))
    out = hidden.new_empty(rows, n_q * dim)
    for index, layer in enumerate(lean.weights()):
        q, k_new, v_new = lean.qkv(layer, hidden, cos, sin)
        for group, batch in enumerate(batches):
            lo, hi = bounds[group], bounds[group + 1]
            k, v = batch.cache.layers[index].append_column(k_new[lo:hi], v_new[lo:hi])
            out[lo:hi] = _single_query_attention(q[lo:hi], k, v, masks[group])
        hidden.add_(layer.o(out))
        hidden.add_(lean.mlp(layer, hidden))
    for batch in batches:
        batch.length += 1
    return lean.logits(hidden)


def measure(model, rows: int, steps: int, repeats: int, groups: int, seed: int) -> dict:
    prompts = sorted(_prompts(rows, seed), key=len, reverse=True)  # group order: longest first
    batch = PaddedKVBatch(model)
    fast = batch.fast
    n_q, n_kv, dim = fast.n_heads, fast.n_kv_heads, fast.head_dim
    bounds = [round(i * rows / groups) for i in range(groups + 1)]
    spans = [(lo, hi) for lo, hi in pairwise(bounds) if hi > lo]
    parts = [PaddedKVBatch(model) for _ in spans]
    for part in parts:
        part.fast = fast  # one copy of the fused weights
    step_times, grouped_times, logits_diff = [], [], 0.0
    with torch.inference_mode():
        tokens = batch.prefill(prompts).argmax(-1)
        for part, (lo, hi) in zip(parts, spans, strict=True):
            part.prefill(prompts[lo:hi])
        for _ in range(steps):
            start = time.process_time()
            logits = batch.decode(tokens)
            step_times.append(time.process_time() - start)
            start = time.process_time()
            grouped_logits = _grouped_decode(fast, parts, tokens)
            grouped_times.append(time.process_time() - start)
            logits_diff = max(logits_diff, float((grouped_logits - logits).abs().max()))
            tokens = logits.argmax(-1)  # both layouts are fed the same tokens
        assert logits_diff < 1e-4, logits_diff

        pads, end = batch.pads.clone(), batch.length
        buffers = _buffers(batch)
        width = buffers[0][0].shape[2]
        q = torch.randn(rows, n_q, dim) * dim**-0.5
        full_mask = _mask(pads, 0, width, end, n_kv)
        sliced_mask = full_mask[:, :, :end]
        order = torch.argsort(pads)  # longest rows first
        tight = []  # per layer: (row index, q, keys, values, mask) of every length group
        for k, v in buffers:
            parts = []
            for lo, hi in spans:
                index = order[lo:hi]
                first = int(pads[index].min())
                parts.append(
                    (
                        index,
                        q[index].contiguous(),
                        k[index][:, :, first:end].contiguous(),
                        v[index][:, :, first:end].contiguous(),
                        _mask(pads[index], first, end, end, n_kv),
                    )
                )
            tight.append(parts)

        def attention():
            return [_single_query_attention(q, k, v, full_mask) for k, v in buffers]

        def sliced():
            return [_single_query_attention(q, k[:, :, :end], v[:, :, :end], sliced_mask) for k, v in buffers]

        def grouped():
            outs = []
            for parts in tight:
                out = q.new_empty(rows, n_q * dim)
                for index, gq, gk, gv, gmask in parts:
                    out[index] = _single_query_attention(gq, gk, gv, gmask)
                outs.append(out)
            return outs

        fused = fast.weights()
        x_hidden = torch.randn(rows, model.config.hidden_size)
        x_inter = torch.randn(rows, model.config.intermediate_size)
        x_attn = torch.randn(rows, n_q * dim)

        def linears():
            for layer in fused:
                layer.qkv(x_hidden), layer.o(x_attn), layer.gate_up(x_hidden), layer.down(x_inter)
            fast._lm_head(x_hidden)

        params = [SamplingParams(greedy=False)] * rows
        draws = torch.Generator().manual_seed(0)

        def lm_head():
            fast._lm_head(x_hidden)

        def sampling():
            sample_next_tokens(logits, params, draws)

        reference = attention()
        diffs = {
            name: max(float((a - b).abs().max()) for a, b in zip(fn(), reference, strict=True))
            for name, fn in (("sliced", sliced), ("grouped", grouped))
        }
        assert all(d < 1e-5 for d in diffs.values()), diffs
        ways = {
            "linears": linears,
            "lm_head": lm_head,
            "sampling": sampling,
            "attention": attention,
            "sliced": sliced,
            "grouped": grouped,
        }
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(repeats):
            for name, fn in ways.items():
                start = time.process_time()
                fn()
                best[name] = min(best[name], time.process_time() - start)

    attended = rows * width
    valid = float((end - pads).clamp(min=0).sum()) / attended
    ms = {name: round(t * 1e3, 2) for name, t in best.items()}
    ms["step"] = round(sum(step_times) / steps * 1e3, 2)  # mean over the steps
    ms["grouped_step"] = round(sum(grouped_times) / steps * 1e3, 2)
    return {
        "rows": rows,
        "columns": width,
        "length": end,
        "valid": round(valid, 3),
        "ms": ms,
        "attention_share_of_step": round(ms["attention"] / ms["step"], 3),
        "grouped_vs_attention": round(ms["grouped"] / ms["attention"], 3),
        "sliced_vs_attention": round(ms["sliced"] / ms["attention"], 3),
        "grouped_step_vs_step": round(ms["grouped_step"] / ms["step"], 3),
        "max_abs_diff": {**diffs, "grouped_step_logits": logits_diff},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="qwen2-6.4m", help="a name or folder, or qwen2-6.4m (engine_throughput's)"
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    parser.add_argument(
        "--steps",
        type=int,
        default=40,
        help="decoding steps timed (both layouts) before the attention timings (40: 24 spare columns left)",
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="length groups of the `grouped` variant")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from transformers import AutoModelForCausalLM

    if args.model == "qwen2-6.4m":
        from engine_throughput import BENCH_QWEN2, build_bench_qwen2

        from areal_nb.models.cache import cache_root

        path = str(build_bench_qwen2(cache_root() / "bench" / BENCH_QWEN2))
    else:
        from areal_nb.models import resolve_model_path

        path = str(resolve_model_path(args.model))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if not PaddedKVBatch(model).fast:
        raise SystemExit(f"{args.model} does not use the lean forward; nothing to measure")
    results = []
    for rows in args.rows:
        r = measure(model, rows, args.steps, args.repeats, args.groups, args.seed)
        ms = r["ms"]
        print(
            f"rows {rows:4d}: step {ms['step']:.2f} ms, linears {ms['linears']:.2f} (LM head "
            f"{ms['lm_head']:.2f}), sampling {ms['sampling']:.2f}, attention "
            f"{ms['attention']:.2f} ({r['attention_share_of_step']:.0%} of the step) over {r['columns']} columns, "
            f"{r['valid']:.0%} of them valid; sliced {ms['sliced']:.2f} ({r['sliced_vs_attention']:.2f}x), "
            f"{args.groups} length groups {ms['grouped']:.2f} ({r['grouped_vs_attention']:.2f}x); "
            f"step over {args.groups} length-group buffers {ms['grouped_step']:.2f} ms "
            f"({r['grouped_step_vs_step']:.3f}x the step)",
            flush=True,
        )
        results.append(r)
    print(json.dumps({"model": args.model, "threads": 1, "results": results}))


if __name__ == "__main__":
    main()

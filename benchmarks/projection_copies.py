"""What the lean decode path's copies of the projection weights buy at SmolLM2-135M's shape.

`engine/qwen2_fast.py` fuses q|k|v and gate|up into new tensors and, on CPU in float32, prepacks
every projection for oneDNN (`_Linear`): a second copy of nearly all weights, rebuilt after every
weight push. An engine serving the trainer's parameters in place could instead run F.linear on
those tensors directly. This times one decoding step's projections (30 layers + LM head, rows
8 / 32 / 128, one torch thread up to 64 rows as the engine does) three ways, alternating them
so that a busy machine slows each alike, and prints the minimum per way, the bytes each keeps
besides the model's weights and the time to rebuild its copies (once per push):

- `packed`: fused and prepacked (what qwen2_fast does now);
- `fused`: fused copies, plain F.linear (no prepacking);
- `shared`: F.linear on the model's own q, k, v, o, gate, up, down and head tensors (no copy).

    python benchmarks/projection_copies.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 576, 9, 3, 64, 1536, 49152, 30


def make_weights(gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    def w(out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=gen) * 0.02

    return [
        {
            "q": w(HEADS * HEAD_DIM, HIDDEN),
            "k": w(KV_HEADS * HEAD_DIM, HIDDEN),
            "v": w(KV_HEADS * HEAD_DIM, HIDDEN),
            "o": w(HIDDEN, HEADS * HEAD_DIM),
            "gate": w(INTER, HIDDEN),
            "up": w(INTER, HIDDEN),
            "down": w(HIDDEN, INTER),
        }
        for _ in range(LAYERS)
    ]


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def build(way: str, layers: list[dict[str, torch.Tensor]], head: torch.Tensor):
    """(the copies it keeps, a function running one step's projections on x [rows, HIDDEN])."""
    if way == "shared":
        copies: list[torch.Tensor] = []

        def run(x: torch.Tensor) -> torch.Tensor:
            for lw in layers:
                q, k, v = F.linear(x, lw["q"]), F.linear(x, lw["k"]), F.linear(x, lw["v"])
                x = x + F.linear(q, lw["o"]) * 0.0 + (k.sum() + v.sum()) * 0.0
                x = x + F.linear(F.silu(F.linear(x, lw["gate"])) * F.linear(x, lw["up"]), lw["down"]) * 1e-3
            return F.linear(x, head)

        return copies, run
    fused = [
        (torch.cat([lw["q"], lw["k"], lw["v"]]), lw["o"], torch.cat([lw["gate"], lw["up"]]), lw["down"])
        for lw in layers
    ]
    if way == "fused":
        copies = [t for qkv, _, gate_up, _ in fused for t in (qkv, gate_up)]

        def run(x: torch.Tensor) -> torch.Tensor:
            for qkv, o, gate_up, down in fused:
                q = F.linear(x, qkv)[:, : HEADS * HEAD_DIM]
                x = x + F.linear(q, o) * 0.0
                gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, down) * 1e-3
            return F.linear(x, head)

        return copies, run
    packed = [tuple(pack(t) for t in group) for group in fused]
    packed_head = pack(head)
    copies = [t for group in packed for t in group] + [packed_head]

    def run(x: torch.Tensor) -> torch.Tensor:
        for qkv, o, gate_up, down in packed:
            q = packed_linear(x, qkv)[:, : HEADS * HEAD_DIM]
            x = x + packed_linear(q.contiguous(), o) * 0.0
            gate, up = packed_linear(x, gate_up).chunk(2, dim=-1)
            x = x + packed_linear((F.silu(gate) * up).contiguous(), down) * 1e-3
        return packed_linear(x, packed_head)

    return copies, run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="*", default=[8, 32, 128])
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    layers, head = make_weights(gen), torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02
    ways = ("packed", "fused", "shared")
    built, rebuild = {}, {}
    for way in ways:
        start = time.perf_counter()
        built[way] = build(way, layers, head)
        rebuild[way] = time.perf_counter() - start
    for way in ways:
        extra = sum(t.numel() * t.element_size() for t in built[way][0])
        print(f"{way:7s} copies {extra / 2**30:.3f} GiB, rebuilt in {rebuild[way] * 1e3:.0f} ms", flush=True)
    with torch.inference_mode():
        for rows in args.rows:
            threads = 1 if rows <= 64 else torch.get_num_threads()
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            x = torch.randn(rows, HIDDEN, generator=gen)
            best = dict.fromkeys(ways, float("inf"))
            for _ in range(args.repeats):
                for way in ways:
                    start = time.perf_counter()
                    built[way][1](x)
                    best[way] = min(best[way], time.perf_counter() - start)
            torch.set_num_threads(before)
            line = ", ".join(f"{w} {best[w] * 1e3:.2f} ms" for w in ways)
            print(f"rows {rows} ({threads} thread{'s' if threads > 1 else ''}): {line}", flush=True)


if __name__ == "__main__":
    main()

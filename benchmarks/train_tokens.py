"""Training on unique tokens: trained tokens / unique tokens and the training time of one step with
and without prefix sharing (`actor.pack`), its flat layout with tree attention
(`actor.tree_attention`, against one dense-masked sequence per group), the last decoder layer at
the loss's nodes only (`actor.last_layer_at_heads`, against the whole last layer) and the skipped
recomputation (`actor.skip_redundant_recompute`), on one demo batch (16 prompts x 8 samples,
concat, 2 turns).

    .venv/bin/python benchmarks/train_tokens.py [--repeats 3] [overrides ...]

Every variant trains a copy of the same actor on the same batch, interleaved, so the machine's
load hits them alike. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from areal_nb.api.train_batch import TrainBatch

ROOT = Path(__file__).resolve().parent.parent

VARIANTS = {  # name: actor overrides
    "padded+recompute": {"pack": False, "skip_redundant_recompute": False},  # padded, recomputed
    "padded": {"pack": False},
    "packed+recompute": {"pack": True, "skip_redundant_recompute": False},
    "packed-dense": {"pack": True, "tree_attention": False},  # one sequence per group, dense tree mask
    "packed-full-last-layer": {"pack": True, "last_layer_at_heads": False},  # the last layer at every node
    "packed": {"pack": True},  # the default: one flat trie, tree attention
}


def token_report(tensors: TrainBatch, packed_positions: float, padded_positions: float) -> dict[str, float]:
    """Trained positions (padding included) over unique tokens (distinct prefixes of the batch)."""
    from areal_nb.train.packing import count_unique_tokens

    unique = count_unique_tokens(tensors.input_ids, tensors.attention_mask)
    return {
        "unique_tokens": unique,
        "row_tokens": int(tensors.attention_mask.sum()),
        "trained_tokens_packed": packed_positions,
        "trained_tokens_padded": padded_positions,
        "trained_over_unique_packed": packed_positions / unique,
        "trained_over_unique_padded": padded_positions / unique,
    }


def time_variants(actor: Any, tensors: TrainBatch, credit: str, repeats: int) -> dict[str, dict[str, float]]:
    """Median train_step seconds of each variant on copies of `actor` (the batch is not consumed)."""
    from areal_nb.train import Actor

    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {
        name: [] for name in VARIANTS
    }  # process CPU time: the figure on a loaded machine
    stats: dict[str, dict[str, float]] = {}
    for _ in range(repeats):
        for name, overrides in VARIANTS.items():
            clone = Actor(
                copy.deepcopy(actor.model), dataclasses.replace(actor.cfg, **overrides), version=actor.version
            )
            clone.steps_done = actor.steps_done
            t0, c0 = time.perf_counter(), time.process_time()
            stats[name] = clone.train_step(tensors, credit=credit)
            seconds[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {
        name: {
            "train_s": statistics.median(seconds[name]),
            "cpu_s": statistics.median(cpu[name]),
            "loss": stats[name]["loss"],
            "positions": stats[name]["train_positions"],
        }
        for name in VARIANTS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi_turn_math.yaml"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(args.config, [*args.overrides, "logging.progress=false", "rollout.prefetch=false"])
    with Session(cfg) as session:
        batch = session.rollout()
        tensors = batch.to_tensors()
        timings = time_variants(session.actor, tensors, batch.credit, args.repeats)
    report = token_report(tensors, timings["packed"]["positions"], timings["padded"]["positions"])
    report.update({f"{name}_train_s": t["train_s"] for name, t in timings.items()})
    report.update({f"{name}_cpu_s": t["cpu_s"] for name, t in timings.items()})
    report["loss_diff_packed_vs_padded"] = abs(
        timings["packed"]["loss"] - timings["padded+recompute"]["loss"]
    )
    report["trained_tokens_packed_dense"] = timings["packed-dense"]["positions"]
    report["packed_over_packed_dense_train"] = (
        timings["packed"]["train_s"] / timings["packed-dense"]["train_s"]
    )
    report["packed_over_packed_dense_cpu"] = timings["packed"]["cpu_s"] / timings["packed-dense"]["cpu_s"]
    full = timings["packed-full-last-layer"]
    report["packed_over_full_last_layer_train"] = timings["packed"]["train_s"] / full["train_s"]
    report["packed_over_full_last_layer_cpu"] = timings["packed"]["cpu_s"] / full["cpu_s"]
    report["loss_diff_packed_vs_full_last_layer"] = abs(timings["packed"]["loss"] - full["loss"])
    report["rows"] = int(tensors.input_ids.shape[0])
    report["style"] = batch.style
    print(
        f"{report['rows']} {batch.style} rows: {report['row_tokens']} row tokens, {report['unique_tokens']} unique; "
        f"trained/unique {report['trained_over_unique_packed']:.2f} packed, "
        f"{report['trained_over_unique_padded']:.2f} padded"
    )
    for name, t in timings.items():
        print(
            f"  {name:22s} train step {t['train_s']:.2f} s, CPU {t['cpu_s']:.2f} s (medians of {args.repeats}), "
            f"{t['positions']:.0f} positions"
        )
    print(
        f"  packed / packed-dense train step: {report['packed_over_packed_dense_train']:.2f}x wall, "
        f"{report['packed_over_packed_dense_cpu']:.2f}x CPU"
    )
    print(
        f"  packed / packed-full-last-layer (last layer at every node): "
        f"{report['packed_over_full_last_layer_train']:.2f}x wall, {report['packed_over_full_last_layer_cpu']:.2f}x CPU "
        f"(loss differs by {report['loss_diff_packed_vs_full_last_layer']:.1e}); load average {os.getloadavg()[0]:.1f}"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

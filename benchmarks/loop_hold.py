"""How long the proxy's event loop is held while a conversation is rendered and tokenized, in
place vs in a worker thread (`capture/generate.py` INLINE_RENDER_CHARS picks between them).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/loop_hold.py [--repeats 15]

For each prompt size (digit text, the tiny-math tokenizer's most expensive kind: ~1.2 us a char):
the render's CPU time, and the longest gap between the ticks of a coroutine that wakes every
1 ms on the same loop while one render runs, in place and via `asyncio.to_thread`, alternating
(median of the repeats). A gap is what a `/health` call waits behind the render; on a loaded
machine it grows by the share of time the loop thread waits for a CPU. Also the loop thread's CPU
for one thread hop. The last line is one JSON object.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


async def longest_gap(render, inline: bool) -> float:
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.005)
    if inline:
        render()
    else:
        await asyncio.to_thread(render)
    await asyncio.sleep(0.003)
    done = True
    await task
    return max(gaps)


async def hop_cpu(n: int = 200) -> float:
    costs = []
    for _ in range(n):
        start = time.thread_time()
        await asyncio.to_thread(lambda: None)
        costs.append(time.thread_time() - start)
    return statistics.median(costs)


async def main(sizes: list[int], repeats: int) -> dict:
    from areal_nb.capture.prompt_memo import prompt_memo
    from areal_nb.capture.templates import render_prompt_ids
    from areal_nb.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-math")
    prompt_memo(
        tokenizer
    ).max_entries = 0  # every render is a fresh one (a GRPO group's repeats would be hits)
    rows = []
    for chars in sizes:
        messages = [{"role": "user", "content": "1+" * (chars // 2)}]

        def render(messages=messages) -> None:
            render_prompt_ids(tokenizer, messages)

        render()  # warm (template compiled)
        cpu, inline, thread = [], [], []
        for _ in range(repeats):
            start = time.thread_time()
            render()
            cpu.append(time.thread_time() - start)
            inline.append(await longest_gap(render, inline=True))
            thread.append(await longest_gap(render, inline=False))
        row = {
            "chars": chars,
            "render_cpu_ms": statistics.median(cpu) * 1e3,
            "gap_inline_ms": statistics.median(inline) * 1e3,
            "gap_thread_ms": statistics.median(thread) * 1e3,
        }
        row["thread_over_inline"] = row["gap_thread_ms"] / row["gap_inline_ms"]
        rows.append(row)
        print(
            f"{chars:6d} chars: render {row['render_cpu_ms']:6.2f} ms CPU; longest loop gap in place "
            f"{row['gap_inline_ms']:6.2f} ms, in a thread {row['gap_thread_ms']:6.2f} ms "
            f"({row['thread_over_inline']:.2f}x)",
            flush=True,
        )
    hop = await hop_cpu()
    print(
        f"one asyncio.to_thread hop: {hop * 1e3:.3f} ms of loop-thread CPU; load average {os.getloadavg()[0]:.2f}"
    )
    return {"rows": rows, "hop_loop_cpu_ms": hop * 1e3, "load_average": os.getloadavg()[0]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 6144, 16384])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.sizes, args.repeats))))

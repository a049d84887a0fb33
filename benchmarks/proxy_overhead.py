"""Proxy overhead: the same chat calls through the HTTP proxy vs the in-process completion
function, on a zero-cost engine (ScriptedEngine replying with fixed tokens).

    python benchmarks/proxy_overhead.py [--calls 400] [--concurrent 64] [--server process|thread]

Prints per-phase JSON lines; the last line is one JSON object with `p50_overhead_ms`,
`p99_overhead_ms` (proxy minus direct latency per call, one session) and `calls_per_s_64`
(proxy calls per second with 64 concurrent sessions). With `--server process` (default) the
proxy runs in a child process, so the client and the server each get a core, as they do when
agents run in other processes; `--server thread` runs it in this process (the notebook set-up); `--server inprocess` calls the
app in-process on the caller's loop, no socket (what a Session's inline agents get, see
`areal_nb/proxy/inprocess.py`: chat completions take the app's direct lane); `--server asgi` the
same through a plain `httpx.ASGITransport` (the whole ASGI stack per call, the path before the lane).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

ADMIN_KEY = "bench-admin-key"
MESSAGES = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 12 + 30?"},
]
REPLY = "The answer is 42"
CALLS_PER_SESSION = 16  # agent episodes are short; keeps parent search as in real use


def build_app():
    from areal_nb.models import load_tokenizer
    from areal_nb.proxy import ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine

    tokenizer = load_tokenizer("tiny-math")
    tokens = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    return (
        create_app(ScriptedEngine(tokenizer, tokens), tokenizer, ProxySettings(admin_api_key=ADMIN_KEY)),
        tokenizer,
        tokens,
    )


def serve_forever(port: int) -> None:
    """Child-process entry: serve the benchmark app until killed."""
    from areal_nb.proxy import ProxyServer

    app, _, _ = build_app()
    server = ProxyServer(app, port=port).start()
    print(server.url, flush=True)
    while True:
        time.sleep(3600)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def direct_latencies(n: int) -> list[float]:
    from areal_nb.capture.cache import InteractionCache
    from areal_nb.capture.completion import CompletionSettings, create_chat_completion

    app, tokenizer, _ = build_app()
    engine, settings = app.state.engine, CompletionSettings()
    out = []
    cache = InteractionCache()
    for i in range(n):
        if i % CALLS_PER_SESSION == 0:
            cache = InteractionCache()
        start = time.perf_counter()
        await create_chat_completion(
            engine=engine,
            tokenizer=tokenizer,
            settings=settings,
            cache=cache,
            messages=MESSAGES,
            max_tokens=16,
        )
        out.append(time.perf_counter() - start)
    return out


async def new_key(client: httpx.AsyncClient) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    await client.post("/grant_capacity", headers=admin)
    r = await client.post("/rl/start_session", headers=admin, json={"task_id": "bench"})
    r.raise_for_status()
    return r.json()["api_key"]


async def session_worker(client: httpx.AsyncClient, calls: int, latencies: list[float]) -> None:
    key = ""
    for i in range(calls):
        if i % CALLS_PER_SESSION == 0:
            key = await new_key(client)
        start = time.perf_counter()
        r = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"messages": MESSAGES, "max_tokens": 16},
        )
        latencies.append(time.perf_counter() - start)
        if r.status_code != 200:
            raise RuntimeError(f"proxy call failed: {r.status_code} {r.text}")


async def proxy_run(
    url: str, sessions: int, calls_per_session: int, app: object = None, lane: bool = True
) -> tuple[list[float], float]:
    from areal_nb.proxy.inprocess import asgi_http_client

    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    if app is None:
        client = httpx.AsyncClient(base_url=url, limits=limits, timeout=60)
    elif lane:
        client = asgi_http_client(app, url, timeout=60)
    else:
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url=url, timeout=60
        )
    async with client:
        await session_worker(client, 8, [])  # warm up connections and code paths
        latencies: list[float] = []
        start = time.perf_counter()
        await asyncio.gather(*(session_worker(client, calls_per_session, latencies) for _ in range(sessions)))
        return latencies, time.perf_counter() - start


def start_server(mode: str) -> tuple[str, object]:
    if mode in ("inprocess", "asgi"):
        app, _, _ = build_app()
        return "http://inprocess", lambda: None, app
    if mode == "thread":
        from areal_nb.proxy import ProxyServer

        app, _, _ = build_app()
        server = ProxyServer(app).start()
        return server.url, server.stop, None
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError("benchmark server did not start")

    def stop() -> None:
        proc.terminate()
        proc.wait(10)

    return url, stop, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=400, help="calls in the one-session runs")
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument(
        "--calls-per-session", type=int, default=16, help="calls per session in the concurrent run"
    )
    parser.add_argument("--server", choices=("process", "thread", "inprocess", "asgi"), default="process")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve_forever(args.serve)
        return

    direct = asyncio.run(direct_latencies(args.calls))
    url, stop, app = start_server(args.server)
    try:
        lane = args.server != "asgi"
        single, _ = asyncio.run(proxy_run(url, 1, args.calls, app, lane))
        many, elapsed = asyncio.run(proxy_run(url, args.concurrent, args.calls_per_session, app, lane))
    finally:
        stop()
    d50, d99 = percentile(direct, 0.5) * 1e3, percentile(direct, 0.99) * 1e3
    p50, p99 = percentile(single, 0.5) * 1e3, percentile(single, 0.99) * 1e3
    print(
        json.dumps(
            {
                "phase": "direct",
                "calls": len(direct),
                "p50_ms": round(d50, 3),
                "p99_ms": round(d99, 3),
                "calls_per_s": round(len(direct) / sum(direct), 1),
            }
        )
    )
    print(
        json.dumps(
            {
                "phase": "proxy_1_session",
                "calls": len(single),
                "p50_ms": round(p50, 3),
                "p99_ms": round(p99, 3),
                "calls_per_s": round(len(single) / sum(single), 1),
            }
        )
    )
    print(
        json.dumps(
            {
                "phase": f"proxy_{args.concurrent}_sessions",
                "calls": len(many),
                "elapsed_s": round(elapsed, 3),
                "p50_ms": round(percentile(many, 0.5) * 1e3, 3),
                "mean_ms": round(statistics.mean(many) * 1e3, 3),
            }
        )
    )
    print(
        json.dumps(
            {
                "server": args.server,
                "p50_overhead_ms": round(p50 - d50, 3),
                "p99_overhead_ms": round(p99 - d99, 3),
                "calls_per_s_1": round(len(single) / sum(single), 1),
                "calls_per_s_64": round(len(many) / elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

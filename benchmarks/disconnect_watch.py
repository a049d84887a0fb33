"""What watching for a client that leaves costs per `/generate` (`api.client_gone`).

An engine-server with an instant scripted engine (so only the HTTP path is measured) answers
bursts of requests from an httpx client in the same process; rounds alternate between the server
as it is and the server with the watch replaced by a plain await. Prints the median CPU time per
request (client + server, `time.process_time`) of each and their ratio, and the load average.

    python benchmarks/disconnect_watch.py [--requests 500] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import httpx

from areal_nb.api import ModelResponse
from areal_nb.engine.server import EngineServerSettings, create_engine_app
from areal_nb.engine.server import asgi as server_asgi  # where /generate awaits unless_client_leaves
from areal_nb.proxy import ProxyServer
from areal_nb.testing import ServedStub


class InstantEngine(ServedStub):
    """Answers every request at once with 8 fixed tokens: the HTTP path alone is measured."""

    async def agenerate(self, req):
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=list(range(10, 18)),
            output_logprobs=[-0.5] * 8,
            output_versions=[0] * 8,
            stop_reason="length",
        )


async def _plain(call, receive):
    return await call


async def _burst(url: str, n: int) -> None:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}
    async with httpx.AsyncClient(base_url=url) as client:
        gate = asyncio.Semaphore(16)

        async def one() -> None:
            async with gate:
                assert (await client.post("/generate", json=body)).status_code == 200

        await asyncio.gather(*(one() for _ in range(n)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    watched = server_asgi.unless_client_leaves
    server = ProxyServer(create_engine_app(InstantEngine(), EngineServerSettings())).start()
    cpu: dict[str, list[float]] = {"plain": [], "watched": []}
    try:
        for r in range(args.rounds):
            order = [("plain", _plain), ("watched", watched)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                server_asgi.unless_client_leaves = fn
                start = time.process_time()
                asyncio.run(_burst(server.url, args.requests))
                cpu[name].append((time.process_time() - start) / args.requests * 1e6)
    finally:
        server_asgi.unless_client_leaves = watched
        server.stop()
    plain, with_watch = statistics.median(cpu["plain"]), statistics.median(cpu["watched"])
    print(
        f"CPU per /generate: plain await {plain:.0f} us, with the disconnect watch {with_watch:.0f} us, "
        f"ratio {with_watch / plain:.3f}  (load average {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()

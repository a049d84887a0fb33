"""`SGLangEngine` over two real `areal-nb engine-server` processes: routing, and one server killed
mid-generation (its requests fail with a reason naming it, the others finish, nothing hangs)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
from servers import API_KEY, load_reference, start_engine_server

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine.remote import ServerDownError, SGLangEngine
from areal_nb.models import resolve_model_path

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 42, 99, 7, 31]


@pytest.fixture
def two_servers(tmp_path):
    shared = tmp_path / "shared-weights"
    procs = [start_engine_server(tmp_path / name, name=name, weights_dir=shared) for name in ("a", "b")]
    yield procs
    for proc in procs:
        proc.stop()


def _req(i: int, n: int) -> ModelRequest:
    return ModelRequest(PROMPT + [10 + i], GenerationConfig(max_new_tokens=n, ignore_eos=True))


def test_conversations_stick_to_their_server_and_new_ones_spread(two_servers):
    engine = SGLangEngine([p.url for p in two_servers], api_key=API_KEY)

    def assigned() -> list[int]:
        return [s["assigned"] for s in engine.server_status()]

    async def run():
        seen = []
        first = await engine.agenerate(_req(0, 6))
        seen.append(assigned())
        # the next turn extends the first conversation's exact tokens: same server, although the
        # other one has served fewer requests
        turn2 = await engine.agenerate(
            ModelRequest(
                first.input_tokens + first.output_tokens + [3, 4], GenerationConfig(max_new_tokens=4)
            )
        )
        seen.append(assigned())
        await engine.agenerate(
            ModelRequest(turn2.input_tokens + turn2.output_tokens + [5], GenerationConfig(max_new_tokens=4))
        )
        seen.append(assigned())
        # new conversations (the same first prompt, as in a GRPO group) go to the least-loaded server
        await asyncio.gather(*(engine.agenerate(_req(0, 6)) for _ in range(4)))
        seen.append(assigned())
        return seen

    try:
        seen = asyncio.run(run())
    finally:
        engine.close()
    home = seen[0].index(1)
    assert seen[1][home] == 2 and seen[2][home] == 3 and sum(seen[2]) == 3
    assert [b - a for a, b in zip(seen[2], seen[3], strict=True)] == [2, 2]  # fewest in flight wins


def test_killing_one_server_mid_generation_fails_its_requests_and_the_rest_finish(two_servers):
    dead, survivor = two_servers
    weights_dir = Path(survivor.command[survivor.command.index("--weights-dir") + 1])
    engine = SGLangEngine([p.url for p in two_servers], api_key=API_KEY, weights_dir=weights_dir)
    new_weights = load_reference(resolve_model_path("tiny-math")).state_dict()
    n_new = 480

    async def run():
        tasks = [asyncio.ensure_future(engine.agenerate(_req(i, n_new))) for i in range(8)]
        # kill only once the dead server holds its share: under load 0.3 s may not be enough
        # for the requests to leave the client (a hang guard bounds the wait, not a timing assert)
        for _ in range(600):
            if engine.server_status()[0]["in_flight"] == 4:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        os.killpg(dead.pid, signal.SIGKILL)  # a crash, not a clean shutdown
        # a hang guard, not a timing assertion: every request must end
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=300)
        # a weight update goes on without the dead server
        await engine.aupdate_weights(new_weights, version=1)
        after = await engine.agenerate(_req(99, 5))
        return results, after

    try:
        results, after = asyncio.run(run())
        status = engine.server_status()
    finally:
        engine.close()
    failed = [r for r in results if isinstance(r, BaseException)]
    finished = [r for r in results if not isinstance(r, BaseException)]
    assert len(failed) == 4 and len(finished) == 4
    assert all(isinstance(e, ServerDownError) and dead.url in str(e) for e in failed)
    assert all(r.stop_reason == "length" and r.output_len == n_new for r in finished)
    assert after.output_len == 5 and after.output_versions == [1] * 5  # the survivor, updated
    assert status[0]["down"] is not None and status[1]["down"] is None
    assert status[1]["url"] == survivor.url


def test_a_dropped_connection_to_a_healthy_server_fails_one_request_and_keeps_the_server(tmp_path):
    from areal_nb.engine.remote import EngineServerError

    proc = start_engine_server(tmp_path / "a", name="a")
    engine = SGLangEngine([proc.url], api_key=API_KEY)
    real_session = engine._session
    dropped = []

    class DropFirstGenerate:  # /generate goes to the aiohttp session directly
        def post(self, url, **kw):
            if url.endswith("/generate") and not dropped:
                dropped.append(url)
                # what a keep-alive connection closed under us gives
                raise aiohttp.ServerDisconnectedError("Server disconnected")
            return real_session.post(url, **kw)

    engine._session = DropFirstGenerate()
    try:
        with pytest.raises(EngineServerError, match="the server is up and stays in use") as info:
            asyncio.run(engine.agenerate(_req(0, 4)))
        assert not isinstance(info.value, ServerDownError)
        assert engine.server_status()[0]["down"] is None
        assert asyncio.run(engine.agenerate(_req(1, 4))).output_len == 4
    finally:
        engine.close()
        proc.stop()

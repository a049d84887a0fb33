"""AdmissionWindow: a burst reaching an idle engine is released together; a busy engine is not held."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from engine_test_helpers import ServedStub

from areal_nb.api import GenerationConfig, ModelRequest, ModelResponse
from areal_nb.engine.admission import AdmissionWindow
from areal_nb.engine.remote import SGLangEngine
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.proxy.server import ProxyServer


def test_a_burst_at_an_idle_engine_is_released_together_after_the_last_arrival():
    async def run():
        window = AdmissionWindow(gap=0.05, max_wait=30.0, engine_busy=lambda: False)
        released: list[int] = []

        async def request(i: int) -> None:
            await window.wait()
            released.append(i)

        first = [asyncio.ensure_future(request(i)) for i in range(3)]
        await asyncio.sleep(0)  # the three are waiting now
        assert released == [] and window.windows == 1 and window.held == 3
        late = asyncio.ensure_future(request(3))  # arrives while the window is open: joins it
        await asyncio.gather(*first, late)
        return window, released

    window, released = asyncio.run(run())
    assert sorted(released) == [0, 1, 2, 3]
    assert window.windows == 1 and window.held == 4


def test_a_busy_engine_or_a_zero_gap_holds_nothing():
    async def run(window: AdmissionWindow) -> None:
        await asyncio.wait_for(asyncio.gather(*(window.wait() for _ in range(5))), timeout=5)

    busy = AdmissionWindow(gap=30.0, max_wait=30.0, engine_busy=lambda: True)
    asyncio.run(run(busy))
    off = AdmissionWindow(gap=0.0, max_wait=30.0, engine_busy=lambda: False)
    asyncio.run(run(off))
    assert (busy.windows, busy.held, off.windows, off.held) == (0, 0, 0, 0)


def test_max_wait_bounds_the_hold_even_with_a_long_gap():
    async def run() -> AdmissionWindow:
        window = AdmissionWindow(gap=30.0, max_wait=0.01, engine_busy=lambda: False)
        await asyncio.wait_for(window.wait(), timeout=10)  # released by max_wait, not the 30 s gap
        return window

    assert asyncio.run(run()).windows == 1


def test_a_cancelled_waiter_leaves_the_others_in_the_window():
    async def run() -> list[str]:
        window = AdmissionWindow(gap=0.02, max_wait=30.0, engine_busy=lambda: False)
        results: list[str] = []

        async def request(name: str) -> None:
            await window.wait()
            results.append(name)

        gone = asyncio.ensure_future(request("gone"))
        kept = asyncio.ensure_future(request("kept"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.wait_for(kept, timeout=10)
        with pytest.raises(asyncio.CancelledError):
            await gone
        return results

    assert asyncio.run(run()) == ["kept"]


def test_a_request_read_in_the_loop_turn_where_the_timer_fires_still_joins_the_window():
    """The loop thread kept off the CPU past the timer: the rest of the burst is read in the same loop
    turn as the timer fires (their handlers start a turn later); they must not be left out."""

    async def run() -> AdmissionWindow:
        window = AdmissionWindow(gap=0.01, max_wait=30.0, engine_busy=lambda: False)
        loop = asyncio.get_running_loop()
        later: list[asyncio.Future] = []

        def starved_turn() -> None:
            time.sleep(0.05)  # past the first request's timer
            # what a connection's data_received does: the handler task starts on the next turn
            loop.call_soon(lambda: later.append(asyncio.ensure_future(window.wait())))

        first = asyncio.ensure_future(window.wait())
        await asyncio.sleep(0)  # the first request is held; its timer is due in 10 ms
        loop.call_soon(starved_turn)
        await asyncio.wait_for(first, timeout=10)
        await asyncio.wait_for(asyncio.gather(*later), timeout=10)
        return window

    window = asyncio.run(run())
    assert (window.windows, window.held) == (1, 2)


def test_negative_settings_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        AdmissionWindow(gap=-1.0, max_wait=0.02, engine_busy=lambda: False)


class Counting(ServedStub):
    """Answers every request with token 7 after 50 ms and records which rids reached it."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.started.append(req.rid)
        await asyncio.sleep(0.05)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=[7],
            output_logprobs=[-1.0],
            output_versions=[0],
            stop_reason="length",
        )


@pytest.mark.server
def test_engine_server_holds_a_burst_back_and_reports_it():
    engine = Counting()
    settings = EngineServerSettings(admission_gap=0.2, admission_max_wait=2.0)
    server = ProxyServer(create_engine_app(engine, settings)).start()
    client = SGLangEngine([server.url], eos_token_ids=[2])

    async def burst(n: int) -> list[ModelResponse]:
        return await asyncio.gather(
            *(
                client.agenerate(ModelRequest(input_ids=[5, 6], gconfig=GenerationConfig(max_new_tokens=1)))
                for _ in range(n)
            )
        )

    try:
        assert [r.output_tokens for r in asyncio.run(burst(4))] == [[7]] * 4
        assert httpx.get(f"{server.url}/server_info").json()["admission"] == {"windows": 1, "held": 4}
        asyncio.run(burst(1))  # the engine is idle again: a new window
        assert httpx.get(f"{server.url}/server_info").json()["admission"] == {"windows": 2, "held": 5}
        assert len(engine.started) == 5
    finally:
        client.close()
        server.stop()


@pytest.mark.server
def test_a_request_aborted_while_held_answers_abort_without_reaching_the_engine():
    engine = Counting()
    server = ProxyServer(
        create_engine_app(engine, EngineServerSettings(admission_gap=1.0, admission_max_wait=1.0))
    ).start()
    result: list[httpx.Response] = []
    body = {
        "input_ids": [5, 6],
        "rid": "held-1",
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4},
    }
    thread = threading.Thread(
        target=lambda: result.append(httpx.post(f"{server.url}/generate", json=body, timeout=60))
    )
    try:
        thread.start()
        while thread.is_alive():  # an abort for a rid not yet held is ignored: repeat it
            assert httpx.post(f"{server.url}/abort_request", json={"rid": "held-1"}).status_code == 200
            thread.join(0.05)
        out = result[0].json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["output_ids"] == [] and out["meta_info"]["output_token_logprobs"] == []
        assert engine.started == []
        # the rid is free again, and a request that is not aborted reaches the engine
        assert httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["output_ids"] == [7]
        assert engine.started == ["held-1"]
    finally:
        thread.join(60)
        server.stop()

"""Failure isolation in `LocalEngine`: a row whose sampling fails fails alone,
the worker never spins on one error, its log stays bounded, and no request waits forever."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest
from engine_test_helpers import max_logprob_error, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import areal_nb.engine.local as local_module
from areal_nb.api import MAX_TEMPERATURE, MIN_TEMPERATURE, GenerationConfig, InvalidRequestError, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.engine.sampling import SamplingParams

PROMPT = [5, 17, 42, 99, 7, 31]


def _req(n: int, **kw) -> ModelRequest:
    return ModelRequest(list(PROMPT), GenerationConfig(max_new_tokens=n, ignore_eos=True, **kw))


@pytest.fixture
def poisoned(monkeypatch):
    """Requests with metadata {"poison": True} slip past validation with temperature 1e-300
    (0 in float32: logits / T is inf and sampling raises), as a validation bug would let them."""
    real = local_module.plan_request

    def plan(req, **kw):
        plan = real(req, **kw)
        if req.metadata.get("poison"):
            object.__setattr__(plan, "sampling", SamplingParams(greedy=False, temperature=1e-300))
        return plan

    monkeypatch.setattr(local_module, "plan_request", plan)


def test_a_row_whose_sampling_fails_fails_alone(engine, reference_model, poisoned, caplog):
    async def run():
        good = asyncio.create_task(engine.agenerate(_req(80)))
        await wait_until(lambda: engine.stats.decode_steps >= 3)
        bad = _req(50)
        bad.metadata["poison"] = True
        with pytest.raises(RuntimeError, match="sampling failed for this request"):
            await asyncio.wait_for(engine.agenerate(bad), 60)
        return await asyncio.wait_for(good, 60)

    with caplog.at_level(logging.ERROR, logger="areal_nb.engine.local"):
        good = asyncio.run(run())
    assert (good.output_len, good.stop_reason) == (80, "length")
    assert max_logprob_error(reference_model, good) <= 1e-4  # the batch it shared is intact
    assert engine.stats.decode_steps <= 80  # no extra iterations spent on the failed row
    assert len([r for r in caplog.records if "could not sample" in r.getMessage()]) == 1
    assert engine.generate(_req(5)).output_len == 5  # the engine serves on


def test_a_failing_step_fails_its_rows_once_and_the_log_is_rate_limited(engine, monkeypatch, caplog):
    real = engine._stop_reason

    def stop_reason(row, token):
        if row.plan.rid.startswith("boom"):
            raise RuntimeError("a bug in the stop check")
        return real(row, token)

    monkeypatch.setattr(engine, "_stop_reason", stop_reason)

    async def run():
        for i in range(6):
            req = _req(20)
            req.rid = f"boom-{i}"
            with pytest.raises(RuntimeError, match="LocalEngine step failed"):
                await asyncio.wait_for(engine.agenerate(req), 60)  # answered, never left waiting
        steps = engine.stats.decode_steps
        await asyncio.sleep(0.3)
        return steps

    with caplog.at_level(logging.ERROR, logger="areal_nb.engine.local"):
        steps = asyncio.run(run())
    assert engine.stats.decode_steps == steps  # idle afterwards: the loop does not spin
    failures = [r for r in caplog.records if "worker iteration failed" in r.getMessage()]
    assert len(failures) == 1  # six failures, one log line (the rest are counted, not written)
    assert engine.generate(_req(4)).output_len == 4


@pytest.fixture(scope="module")
def shared_engine(tiny_model_path):
    eng = LocalEngine(tiny_model_path, seed=0)
    yield eng
    eng.close()


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(0, 2 * MIN_TEMPERATURE, allow_subnormal=True),
    ),
    st.one_of(st.floats(allow_nan=True), st.floats(0, 1)),
    st.booleans(),
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_any_sampling_parameters_are_refused_up_front_or_served(shared_engine, temperature, top_p, greedy):
    req = _req(3, temperature=temperature, top_p=top_p, greedy=greedy)
    valid = greedy or (
        math.isfinite(temperature)
        and (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE)
        and 0 < top_p <= 1
    )
    if not valid:
        with pytest.raises(InvalidRequestError):
            shared_engine.generate(req)
        return
    response = shared_engine.generate(req)
    assert response.output_len == 3 and all(math.isfinite(lp) for lp in response.output_logprobs)

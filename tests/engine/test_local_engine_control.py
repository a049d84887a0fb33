"""LocalEngine control surface on the real tiny-math model: weight updates and versions,
pause/resume, abort, bad input, close, many event loops, engine-owned model copies."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from engine_test_helpers import max_logprob_error, wait_until

from areal_nb.api import GenerationConfig, InferenceEngine, ModelRequest
from areal_nb.engine import EngineClosedError, LocalEngine

PROMPT = [5, 17, 42, 99, 7, 31]


def _long(n: int = 150, **kw) -> ModelRequest:
    return ModelRequest(list(PROMPT), GenerationConfig(max_new_tokens=n, ignore_eos=True, **kw))


def _perturbed(model, scale: float = 0.05, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def test_engine_satisfies_the_protocol(engine):
    assert isinstance(engine, InferenceEngine)
    assert engine.max_context == 512
    assert engine.tokenizer.eos_token_id in engine.eos_token_ids


def test_tokens_after_an_update_during_generation_carry_the_new_version(engine, reference_model):
    new_weights = _perturbed(reference_model)

    async def run():
        task = asyncio.create_task(engine.agenerate(_long(150)))
        await wait_until(lambda: engine.stats.decode_steps >= 5)
        await asyncio.to_thread(engine.update_weights, new_weights, 1)
        tokens_at_update = engine.stats.tokens
        return tokens_at_update, await task

    tokens_at_update, resp = asyncio.run(run())
    first_new = resp.output_versions.index(1)
    assert 5 <= first_new < 150
    assert resp.output_versions == [0] * first_new + [1] * (150 - first_new)
    assert first_new <= tokens_at_update  # no token sampled after the update carries the old version
    assert engine.get_version() == 1

    # A fresh request now sees the new weights (checked against an independent model holding them).
    reference_model_new = type(reference_model)(reference_model.config).eval()
    reference_model_new.load_state_dict(new_weights)
    fresh = engine.generate(_long(30))
    assert fresh.output_versions == [1] * 30
    assert max_logprob_error(reference_model_new, fresh) <= 1e-4


def test_update_weights_from_a_save_pretrained_dir_and_bad_updates(engine, reference_model, tmp_path):
    other = type(reference_model)(reference_model.config).eval()
    other.load_state_dict(_perturbed(reference_model, seed=1))
    other.save_pretrained(tmp_path)
    engine.update_weights(str(tmp_path), version=7)
    resp = engine.generate(_long(20))
    assert resp.output_versions == [7] * 20
    assert max_logprob_error(other, resp) <= 1e-4

    with pytest.raises(ValueError, match="unknown parameter name"):
        engine.update_weights({"no.such.weight": torch.zeros(1)}, version=8)
    name = "model.norm.weight"
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.update_weights({name: torch.zeros(3)}, version=8)
    with pytest.raises(ValueError, match="not a directory"):
        engine.update_weights(str(tmp_path / "missing"), version=8)
    assert engine.get_version() == 7  # nothing applied
    assert max_logprob_error(other, engine.generate(_long(10))) <= 1e-4


def test_set_version_stamps_later_tokens(engine):
    engine.set_version(4)
    assert engine.get_version() == 4
    assert engine.generate(_long(5)).output_versions == [4] * 5


def test_pause_freezes_in_flight_requests_and_resume_finishes_them(engine, reference_model):
    async def run():
        task = asyncio.create_task(engine.agenerate(_long(80)))
        await wait_until(lambda: engine.stats.decode_steps >= 3)
        engine.pause()
        frozen = engine.stats.tokens
        queued = asyncio.create_task(engine.agenerate(_long(10)))
        await asyncio.sleep(0.2)
        still = engine.stats.tokens
        done_while_paused = task.done() or queued.done()
        engine.resume()
        return frozen, still, done_while_paused, await task, await queued

    frozen, still, done_while_paused, resp, queued = asyncio.run(run())
    assert frozen == still and not done_while_paused
    assert resp.output_len == 80 and queued.output_len == 10
    assert max_logprob_error(reference_model, resp) <= 1e-4


def test_abort_returns_partial_output_and_abort_all_empties_the_queue(engine, reference_model):
    long_req = _long(400)

    async def run():
        task = asyncio.create_task(engine.agenerate(long_req))
        await wait_until(lambda: engine.stats.decode_steps >= 3)
        engine.abort(long_req.rid)
        aborted = await task
        engine.pause()
        waiting = [asyncio.create_task(engine.agenerate(_long(5))) for _ in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        engine.abort_all()
        rest = await asyncio.gather(*waiting)
        engine.resume()
        after = await engine.agenerate(_long(6))
        return aborted, rest, after

    aborted, rest, after = asyncio.run(run())
    assert aborted.stop_reason == "abort"
    assert 3 <= aborted.output_len < 400
    assert len(aborted.output_logprobs) == len(aborted.output_versions) == aborted.output_len
    assert max_logprob_error(reference_model, aborted) <= 1e-4
    assert [(r.stop_reason, r.output_len) for r in rest] == [("abort", 0)] * 3
    assert (after.stop_reason, after.output_len) == ("length", 6)


def test_cancelling_the_caller_aborts_the_request(engine):
    async def run():
        task = asyncio.create_task(engine.agenerate(_long(400)))
        await wait_until(lambda: engine.stats.decode_steps >= 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: not engine._live)
        return await engine.agenerate(_long(4))

    assert asyncio.run(run()).output_len == 4
    assert engine.stats.tokens < 400


@pytest.mark.parametrize(
    ("gconfig", "prompt", "message"),
    [
        ({}, [], "empty prompt"),
        ({}, [5] * 512, "too long for the model context of 512"),
        ({"max_new_tokens": 0}, PROMPT, "max_new_tokens must be at least 1, got 0"),
        ({"max_new_tokens": -3}, PROMPT, "max_new_tokens must be at least 1, got -3"),
        ({"stop_token_ids": [2, 10_000]}, PROMPT, r"unknown stop token ids \[10000\]"),
        ({"stop_token_ids": [-1]}, PROMPT, r"unknown stop token ids \[-1\]"),
        ({"n_samples": 2}, PROMPT, "n_samples=2"),
        ({"max_tokens": 6}, PROMPT, "max_tokens=6 leaves no room"),
        ({"temperature": -1.0}, PROMPT, r"temperature must be 0 \(greedy\) or in \[0.01, 100\]"),
        ({"temperature": 1e-300}, PROMPT, "temperature must be 0"),
        ({"temperature": float("nan")}, PROMPT, "temperature must be 0"),
        ({"top_p": float("nan")}, PROMPT, "top_p must be in"),
        ({"stop": [""]}, PROMPT, "stop strings must be non-empty"),
        ({"frequency_penalty": 0.5}, PROMPT, "frequency_penalty is not supported"),
        ({"top_p": 0.0}, PROMPT, "top_p must be in"),
        ({}, [5, 10_000], "outside the vocabulary"),
    ],
)
def test_bad_input_is_rejected_clearly_while_others_keep_running(
    engine, reference_model, gconfig, prompt, message
):
    async def run():
        good = asyncio.create_task(engine.agenerate(_long(60)))
        await wait_until(lambda: engine.stats.decode_steps >= 2)
        with pytest.raises(ValueError, match=message):
            await engine.agenerate(ModelRequest(prompt, GenerationConfig(**gconfig)))
        with pytest.raises(ValueError, match=message):
            engine.generate(ModelRequest(prompt, GenerationConfig(**gconfig)))
        return await good

    good = asyncio.run(run())
    assert (good.output_len, good.stop_reason) == (60, "length")
    assert max_logprob_error(reference_model, good) <= 1e-4


def test_many_event_loops_in_many_threads(engine, reference_model):
    results: dict[int, list] = {}

    def worker(i: int) -> None:
        async def run():
            reqs = [
                ModelRequest([5 + i, 6, 7 + j], GenerationConfig(max_new_tokens=10 + j, ignore_eos=True))
                for j in range(3)
            ]
            return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

        results[i] = asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    for responses in results.values():
        assert [r.output_len for r in responses] == [10, 11, 12]
        assert all(max_logprob_error(reference_model, r) <= 1e-4 for r in responses)


def test_close_fails_pending_requests_and_is_idempotent(tiny_model_path):
    eng = LocalEngine(tiny_model_path)

    async def run():
        eng.pause()
        pending = asyncio.create_task(eng.agenerate(_long(10)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.to_thread(eng.close)
        with pytest.raises(EngineClosedError, match="closed before the request finished"):
            await pending

    asyncio.run(run())
    eng.close()
    assert eng.closed and not eng._thread.is_alive()
    with pytest.raises(EngineClosedError, match="closed"):
        eng.generate(_long(3))


def test_a_loaded_model_is_copied_not_shared(reference_model, tiny_tokenizer):
    trainer_model = type(reference_model)(reference_model.config).eval()
    trainer_model.load_state_dict(reference_model.state_dict())
    with LocalEngine(trainer_model, tiny_tokenizer) as eng:
        assert eng.model is not trainer_model
        before = eng.generate(_long(12, greedy=True))
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(1.0)  # the "trainer" changes its weights; the engine must not see it
        after = eng.generate(_long(12, greedy=True))
        assert after.output_tokens == before.output_tokens
        assert after.output_logprobs == pytest.approx(before.output_logprobs, abs=1e-6)
        assert max_logprob_error(reference_model, after) <= 1e-4

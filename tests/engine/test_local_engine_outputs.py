"""LocalEngine outputs on the real tiny-math model: token consistency, greedy = model.generate,
stop conditions and sampling conventions."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from engine_test_helpers import max_logprob_error, teacher_forced_logprobs, wait_until

from areal_nb.api import GenerationConfig, ModelRequest


def _random_requests(rng: random.Random, vocab: int, n: int, **gconfig) -> list[ModelRequest]:
    return [
        ModelRequest(
            input_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))],
            gconfig=GenerationConfig(max_new_tokens=rng.randint(1, 48), **gconfig),
        )
        for _ in range(n)
    ]


def test_logprobs_equal_teacher_forcing_for_concurrent_requests(engine, reference_model):
    rng = random.Random(0)
    reqs = _random_requests(rng, engine.vocab_size, 12, ignore_eos=True)

    async def run():
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    responses = asyncio.run(run())
    assert engine.stats.max_active == 12  # all of them decoded together
    for req, resp in zip(reqs, responses, strict=True):
        assert resp.input_tokens == req.input_ids
        assert resp.stop_reason == "length"
        assert resp.output_len == req.gconfig.max_new_tokens
        assert len(resp.output_logprobs) == len(resp.output_versions) == resp.output_len
        assert resp.output_versions == [0] * resp.output_len
        assert max_logprob_error(reference_model, resp) <= 1e-4


def test_requests_joining_a_running_batch_keep_token_consistency(engine, reference_model):
    rng = random.Random(1)
    long_req = ModelRequest(
        input_ids=[rng.randrange(3, 500) for _ in range(7)],
        gconfig=GenerationConfig(max_new_tokens=120, ignore_eos=True),
    )
    joiners = _random_requests(rng, engine.vocab_size, 5, ignore_eos=True)

    async def run():
        first = asyncio.create_task(engine.agenerate(long_req))
        await wait_until(lambda: engine.stats.decode_steps >= 4)
        engine.pause()  # freeze the long request mid-generation while the others queue up
        tasks = [asyncio.create_task(engine.agenerate(r)) for r in joiners]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        steps_at_join = engine.stats.decode_steps
        engine.resume()
        results = await asyncio.gather(first, *tasks)
        return steps_at_join, results

    steps_at_join, (long_resp, *joined) = asyncio.run(run())
    assert 4 <= steps_at_join < 120
    assert engine.stats.joined_running_batch == len(joiners)
    assert engine.stats.max_active == 1 + len(joiners)
    assert long_resp.output_len == 120
    for resp in [long_resp, *joined]:
        assert max_logprob_error(reference_model, resp) <= 1e-4


def test_greedy_equals_model_generate(engine, reference_model, tiny_tokenizer):
    prompts = [
        tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in ["What is 3+4?", "Tom has 5 apples and buys 2 more. How many apples?", "What is 9+0?", "Hi"]
    ]
    prompt_ids = [tiny_tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    reqs = [
        ModelRequest(input_ids=ids, gconfig=GenerationConfig(greedy=True, max_new_tokens=40))
        for ids in prompt_ids
    ]

    async def run():
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    responses = asyncio.run(run())
    eos = tiny_tokenizer.eos_token_id
    for ids, resp in zip(prompt_ids, responses, strict=True):
        with torch.inference_mode():
            out = reference_model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=40, eos_token_id=eos, pad_token_id=0
            )
        expected = out[0, len(ids) :].tolist()
        assert resp.output_tokens == expected
        assert resp.stop_reason == ("stop" if expected[-1] == eos else "length")
        assert max_logprob_error(reference_model, resp) <= 1e-4
    assert any(r.stop_reason == "stop" for r in responses)  # the EOS path was exercised


def test_top_k_one_samples_the_argmax_and_reports_the_temperature_logprob(engine, reference_model):
    prompt = [5, 17, 42, 99, 7]
    greedy = engine.generate(
        ModelRequest(prompt, GenerationConfig(greedy=True, max_new_tokens=20, ignore_eos=True))
    )
    sampled = engine.generate(
        ModelRequest(prompt, GenerationConfig(temperature=0.7, top_k=1, max_new_tokens=20, ignore_eos=True))
    )
    assert sampled.output_tokens == greedy.output_tokens
    ref = teacher_forced_logprobs(reference_model, prompt, sampled.output_tokens, temperature=0.7)
    assert float((ref - torch.tensor(sampled.output_logprobs)).abs().max()) <= 1e-4
    # ...and not the truncated distribution's log-prob, which would be exactly 0
    assert min(sampled.output_logprobs) < -1e-3


def test_same_seed_and_arrival_order_give_the_same_samples(tiny_model_path):
    from areal_nb.engine import LocalEngine

    reqs = _random_requests(random.Random(3), 500, 6, ignore_eos=True, top_p=0.9)

    def run_once():
        with LocalEngine(tiny_model_path, seed=11) as eng:
            return [eng.generate(r.copy()).output_tokens for r in reqs]

    assert run_once() == run_once()


def test_stop_token_ids_end_the_output_and_are_kept(engine, tiny_tokenizer):
    # a chat prompt: the reply has distinct tokens (random ids can make the model repeat one)
    prompt = tiny_tokenizer.encode("<|im_start|>user\nWhat is 3+5?<|im_end|>\n<|im_start|>assistant\n")
    free = engine.generate(
        ModelRequest(prompt, GenerationConfig(greedy=True, max_new_tokens=30, ignore_eos=True))
    )
    tokens = free.output_tokens
    cut = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    stopped = engine.generate(
        ModelRequest(
            prompt,
            GenerationConfig(greedy=True, max_new_tokens=30, stop_token_ids=[tokens[cut]], ignore_eos=True),
        )
    )
    assert stopped.output_tokens == tokens[: cut + 1]
    assert stopped.stop_reason == "stop"


def test_stop_strings_end_the_output_at_the_token_that_completes_them(engine, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    free = engine.generate(
        ModelRequest(prompt, GenerationConfig(greedy=True, max_new_tokens=40, ignore_eos=True))
    )
    text = [
        tiny_tokenizer.decode(free.output_tokens[: i + 1], skip_special_tokens=False)
        for i in range(free.output_len)
    ]
    # a stop string that first appears at output token k (k > 1)
    k = next(i for i in range(2, free.output_len) if text[i][-2:] not in text[i - 1])
    stop = text[k][-2:]
    stopped = engine.generate(
        ModelRequest(prompt, GenerationConfig(greedy=True, max_new_tokens=40, ignore_eos=True, stop=[stop]))
    )
    assert stopped.output_tokens == free.output_tokens[: k + 1]
    assert stopped.stop_reason == "stop"
    assert stopped.output_tokens_without_stop == stopped.output_tokens  # no EOS to strip


def test_max_tokens_and_model_context_cap_the_output(engine):
    short = engine.generate(
        ModelRequest([4, 5, 6], GenerationConfig(max_tokens=8, max_new_tokens=50, ignore_eos=True))
    )
    assert (short.output_len, short.stop_reason) == (5, "length")
    near_full = [7] * (engine.max_context - 3)
    capped = engine.generate(ModelRequest(near_full, GenerationConfig(max_new_tokens=50, ignore_eos=True)))
    assert (capped.output_len, capped.stop_reason) == (3, "length")


def test_min_new_tokens_blocks_eos_until_reached(engine, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n")
    free = engine.generate(ModelRequest(prompt, GenerationConfig(greedy=True, max_new_tokens=60)))
    if free.stop_reason != "stop":
        pytest.skip("tiny-math did not emit EOS for this prompt")
    longer = engine.generate(
        ModelRequest(
            prompt, GenerationConfig(greedy=True, max_new_tokens=60, min_new_tokens=free.output_len + 3)
        )
    )
    assert longer.output_len >= free.output_len + 3
    assert tiny_tokenizer.eos_token_id not in longer.output_tokens[: free.output_len + 2]


def test_stock_transformers_forward_path_is_token_consistent_too(tiny_model_path, reference_model):
    from areal_nb.engine import LocalEngine

    reqs = _random_requests(random.Random(5), 500, 6, ignore_eos=True)
    with LocalEngine(tiny_model_path, fast_forward=False) as eng:
        assert eng._batch.fast is None

        async def run():
            return await asyncio.gather(*(eng.agenerate(r) for r in reqs))

        for resp in asyncio.run(run()):
            assert max_logprob_error(reference_model, resp) <= 1e-4


def test_fast_path_is_used_for_qwen2(engine):
    assert engine._batch.fast is not None


def test_one_token_prompts_and_mixed_lengths_in_one_admission_are_token_consistent(engine, reference_model):
    # one-token prompts make a one-column prefill (the boolean-mask path, not the decoding step's);
    # lengths 1..60 in one admission are prefilled as several length groups and joined
    rng = random.Random(7)
    lengths = [1, 1, 60, 2, 45, 30, 1, 59, 8]
    reqs = [
        ModelRequest(
            input_ids=[rng.randrange(3, engine.vocab_size) for _ in range(n)],
            gconfig=GenerationConfig(max_new_tokens=6, ignore_eos=True),
        )
        for n in lengths
    ]
    engine.pause()  # all of them queue, then are admitted together

    async def run():
        tasks = [asyncio.create_task(engine.agenerate(r)) for r in reqs]
        await asyncio.sleep(0.05)
        engine.resume()
        return await asyncio.gather(*tasks)

    responses = asyncio.run(run())
    assert engine.stats.prefills == 1
    for req, resp in zip(reqs, responses, strict=True):
        assert resp.input_tokens == req.input_ids and resp.output_len == 6
        assert max_logprob_error(reference_model, resp) <= 1e-4


def test_small_decoding_steps_run_on_one_thread_and_keep_token_consistency(tiny_model_path, reference_model):
    # rows leave one by one (1..8 new tokens): steps of more than 4 rows keep the worker's thread
    # count, smaller ones run on one thread; the caller's thread count is untouched
    from areal_nb.engine import LocalEngine

    rng = random.Random(11)
    reqs = [
        ModelRequest(
            input_ids=[rng.randrange(3, 500) for _ in range(rng.randint(2, 30))],
            gconfig=GenerationConfig(max_new_tokens=n, ignore_eos=True),
        )
        for n in range(1, 9)
    ]
    caller_threads = torch.get_num_threads()
    with LocalEngine(tiny_model_path, single_thread_rows=4) as eng:
        seen: list[tuple[int, int]] = []  # (rows, threads) per decoding step
        decode = eng._batch.decode

        def recording_decode(last):
            seen.append((last.shape[0], torch.get_num_threads()))
            return decode(last)

        eng._batch.decode = recording_decode
        worker_threads = caller_threads  # the worker starts with torch's count
        eng.pause()

        async def run():
            tasks = [asyncio.create_task(eng.agenerate(r)) for r in reqs]
            await asyncio.sleep(0.05)
            eng.resume()
            return await asyncio.gather(*tasks)

        responses = asyncio.run(run())
    assert [rows for rows, _ in seen] == [7, 6, 5, 4, 3, 2, 1]  # one row finishes at prefill
    assert all(threads == (1 if rows <= 4 else worker_threads) for rows, threads in seen)
    assert torch.get_num_threads() == caller_threads
    for resp in responses:
        assert max_logprob_error(reference_model, resp) <= 1e-4


def test_the_config_and_command_line_set_the_one_thread_rows(tiny_model_path):
    # engine.single_thread_rows / --single-thread-rows reach LocalEngine; 0 keeps every step on
    # torch's threads (the tuning for an engine alone on a machine), negatives are refused
    from areal_nb.cli.engine_server import main as engine_server_main
    from areal_nb.config import EngineConfig
    from areal_nb.engine import create_engine

    engine = create_engine(EngineConfig(single_thread_rows=0), tiny_model_path, None)
    try:
        assert engine.single_thread_rows == 0 and engine._small_work_threads(1) is None
    finally:
        engine.close()
    with pytest.raises(ValueError, match="single_thread_rows"):
        EngineConfig(single_thread_rows=-1)
    assert engine_server_main(["--model", str(tiny_model_path), "--single-thread-rows", "-1"]) == 2


def test_wider_models_run_fewer_rows_on_one_thread():
    # the rows cap holds up to the measured model's width (hidden 256, MLP 1,024); a wider model's
    # steps count as small only while rows x hidden x MLP width stays under 64 of those rows
    from types import SimpleNamespace

    from areal_nb.engine.local_worker import small_step_rows

    def config(hidden, width):
        return SimpleNamespace(hidden_size=hidden, intermediate_size=width)

    assert small_step_rows(config(128, 512), 64) == 64  # the built-in models: the cap
    assert small_step_rows(config(256, 1024), 64) == 64
    assert small_step_rows(config(576, 1536), 64) == 18  # SmolLM2-135M
    assert small_step_rows(config(896, 4864), 64) == 3  # Qwen2.5-0.5B
    assert small_step_rows(config(576, 1536), 0) == 0  # 0 keeps every step on torch's threads
    assert small_step_rows(SimpleNamespace(hidden_size=576), 64) == 64  # no MLP width: the cap


def test_the_engine_sets_its_one_thread_limit_from_its_model(tiny_model_path):
    from areal_nb.engine import LocalEngine

    with LocalEngine(tiny_model_path, single_thread_rows=8) as eng:
        assert eng.single_thread_rows == 8 and eng.single_thread_limit == 8
        assert eng._small_work_threads(8) == 1 and eng._small_work_threads(9) is None

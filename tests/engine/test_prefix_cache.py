"""The engine's prefix cache: a prompt continuing a finished sequence prefills only its new tokens,
with the log-probs of an uncached prefill; weight updates, aborts and failures leave nothing stale."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_test_helpers import max_logprob_error, wait_until

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.engine.prefix_cache import PrefixCache

PROMPT = [5, 17, 42, 99, 7, 31]


def _kv(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), fill)) for _ in range(3)]


def _req(prompt: list[int], n: int = 12, **kw) -> ModelRequest:
    return ModelRequest(list(prompt), GenerationConfig(max_new_tokens=n, ignore_eos=True, **kw))


def _next_turn(resp, message: list[int]) -> list[int]:
    """What a concat-template agent sends next: the whole previous sequence plus a new message."""
    return list(resp.input_tokens) + list(resp.output_tokens) + message


# ---------------------------------------------------------------- PrefixCache alone


def test_lookup_takes_the_longest_cached_prefix_and_leaves_one_token_to_compute():
    cache = PrefixCache(100)
    cache.insert([1, 2, 3], _kv(3, 1.0))
    cache.insert([1, 2, 3, 4, 5], _kv(5, 2.0))
    cache.insert([9, 9], _kv(2))
    hit = cache.lookup([1, 2, 3, 4, 5, 6])
    assert hit.entry.tokens == (1, 2, 3, 4, 5) and hit.length == 5
    assert hit.kv[0][0].shape == (2, 5, 4) and float(hit.kv[0][0][0, 0, 0]) == 2.0
    assert cache.lookup([1, 2, 3, 4]).entry.tokens == (1, 2, 3)
    exact = cache.lookup([1, 2, 3, 4, 5])  # the whole prompt is cached: its last token still runs
    assert exact.entry.tokens == (1, 2, 3, 4, 5) and exact.length == 4 and exact.kv[0][0].shape[1] == 4
    assert cache.lookup([1, 3]) is None and cache.lookup([1]) is None and cache.lookup([2, 1, 2, 3]) is None


def test_memory_is_bounded_by_tokens_least_recently_used_first():
    cache = PrefixCache(10)
    cache.insert([1, 1, 1, 1], _kv(4))
    cache.insert([2, 2, 2, 2], _kv(4))
    assert cache.lookup([1, 1, 1, 1, 7]) is not None  # [1...] is now the most recently used
    cache.insert([3, 3, 3], _kv(3))  # 11 tokens > 10: the least recently used ([2...]) goes
    assert cache.tokens == 7 and len(cache) == 2
    assert cache.lookup([2, 2, 2, 2, 7]) is None and cache.lookup([3, 3, 3, 7]) is not None
    cache.insert(list(range(11)), _kv(11))  # longer than the whole budget: not kept, nothing evicted
    assert cache.tokens == 7
    with pytest.raises(ValueError, match="KV columns"):
        cache.insert([4, 4], _kv(3))
    with pytest.raises(ValueError, match=">= 0"):
        PrefixCache(-1)


def test_a_continuation_replaces_the_entry_it_continued():
    cache = PrefixCache(100)
    cache.insert([1, 2], _kv(2))
    turn1 = cache.lookup([1, 2, 3]).entry
    cache.insert([1, 2, 3, 4], _kv(4), replaces=turn1)
    assert len(cache) == 1 and cache.tokens == 4
    assert cache.lookup([1, 2, 5]) is None  # the shorter entry is gone with its replacement
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.lookup([1, 2, 3, 4, 5]) is None


# ---------------------------------------------------------------- the batch, with and without hits


@pytest.mark.parametrize("fast", [True, False], ids=["fast-forward", "stock-forward"])
def test_rows_with_and_without_cached_prefixes_in_one_prefill_get_unpadded_logits(
    tiny_model_path, reference_model, fast
):
    """Cached rows (of several cached lengths) and fresh rows (long and short) join a running batch in
    one prefill call, across several length groups; every row then decodes with the logits of a
    plain forward over its own sequence."""
    from areal_nb.engine.kv_batch import PaddedKVBatch
    from areal_nb.engine.weights import load_engine_model

    model, _ = load_engine_model(tiny_model_path, None, torch.device("cpu"), torch.float32)
    batch = PaddedKVBatch(model, fast_forward=fast)
    gen = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(3, 100, (n,), generator=gen).tolist()

    def check(rows, logits):
        for row, got in zip(rows, logits, strict=True):
            want = reference_model(torch.tensor([row])).logits[0, -1]
            assert (got - want).abs().max() < 1e-4

    with torch.inference_mode():
        histories = [ids(n) for n in (30, 12, 50)]
        batch.prefill(histories)  # computes their KV: the "finished turns"
        cached = [batch.row_kv(i) for i in range(3)]
        assert [kv[0][0].shape[1] for kv in cached] == [30, 12, 50]
        running = ids(7)
        batch.keep_rows([])
        check([running], batch.prefill([running]))
        # hits with suffixes of 4, 9 and 3 tokens; a hit using only part of its entry; fresh rows of
        # 40 and 5 tokens (several length groups, a cached and a fresh row in one); copies
        # of a fresh and of a cached prompt (computed once)
        new_rows = [histories[0] + ids(4), histories[1] + ids(9), histories[2][:20] + ids(3), ids(40), ids(5)]
        prefixes = [cached[0], cached[1], [(k[:, :20], v[:, :20]) for k, v in cached[2]], None, None]
        new_rows += [list(new_rows[4]), list(new_rows[1]), list(new_rows[4])]
        prefixes += [None, cached[1], None]
        logits = batch.prefill(new_rows, prefixes)
        check(new_rows, logits)
        # the lean forward packs the distinct suffixes (no padding); the stock one groups them as
        # [40], [9], [5, 4] (padded to 5), [3]
        assert batch.last_prefill_computed == (40 + 9 + 5 + 4 + 3 if fast else 40 + 9 + 2 * 5 + 3)
        rows = [running, *new_rows]
        logits = torch.cat([torch.zeros(1, logits.shape[1]), logits])  # the running row's step
        for _ in range(3):
            for row, token in zip(rows, logits.argmax(-1).tolist(), strict=True):
                row.append(token)
            logits = batch.decode(torch.tensor([row[-1] for row in rows]))
            check(rows, logits)
        with pytest.raises(ValueError, match="at least the last prompt token"):
            batch.prefill([histories[0]], [cached[0]])


# ---------------------------------------------------------------- the engine


def test_a_next_turn_reuses_its_history_with_the_log_probs_of_a_full_prefill(
    tiny_model_path, reference_model
):
    """Turn 2 of several conversations, submitted together with fresh prompts: the continuations hit
    the cache, every log-prob equals a teacher-forced pass (<= 1e-4), and greedy tokens equal those of
    an engine without the cache."""
    firsts = [PROMPT, [8, 3, 44, 12], [61, 62, 63, 64, 65, 66, 67, 68, 69]]
    results = {}
    for size in (0, 4096):
        with LocalEngine(tiny_model_path, seed=0, prefix_cache_tokens=size) as engine:

            async def conversation(first, engine=engine):
                turn1 = await engine.agenerate(_req(first, 10, temperature=0.0))
                return turn1, await engine.agenerate(
                    _req(_next_turn(turn1, [2, 11, 12]), 10, temperature=0.0)
                )

            async def run(engine=engine):
                fresh = [engine.agenerate(_req([70 + i, 71, 72], 10, temperature=0.0)) for i in range(3)]
                return await asyncio.gather(*(conversation(f) for f in firsts)), await asyncio.gather(*fresh)

            results[size] = asyncio.run(run()), engine.stats
    (turns, fresh), stats = results[4096]
    (turns_off, fresh_off), stats_off = results[0]
    assert stats.prefix_cache_hits == 3 and stats_off.prefix_cache_hits == 0
    assert stats.prefix_cache_tokens == sum(len(t1.input_tokens) + 9 for t1, _ in turns)
    assert stats.prefill_positions < stats_off.prefill_positions
    for (t1, t2), (_u1, u2) in zip(turns, turns_off, strict=True):
        for resp in (t1, t2):
            assert max_logprob_error(reference_model, resp) <= 1e-4
        assert t2.input_tokens == u2.input_tokens and t2.output_tokens == u2.output_tokens
    assert [r.output_tokens for r in fresh] == [r.output_tokens for r in fresh_off]


def test_a_weight_update_empties_the_cache_and_the_next_turn_sees_only_new_weights(engine, reference_model):
    turn1 = engine.generate(_req(PROMPT, 12))
    assert len(engine.prefix_cache) == 1
    new = {
        k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(0))
        for k, v in reference_model.state_dict().items()
    }
    engine.update_weights(new, version=1)
    assert len(engine.prefix_cache) == 0
    turn2 = engine.generate(_req(_next_turn(turn1, [2, 11]), 12))
    assert engine.stats.prefix_cache_hits == 0 and turn2.output_versions == [1] * 12
    reference_new = type(reference_model)(reference_model.config).eval()
    reference_new.load_state_dict(new)
    assert max_logprob_error(reference_new, turn2) <= 1e-4
    assert len(engine.prefix_cache) == 1  # computed by the new weights: kept


def test_rows_in_flight_across_an_update_and_aborted_rows_are_not_kept(engine):
    async def run():
        task = asyncio.create_task(engine.agenerate(_req(PROMPT, 150)))
        await wait_until(lambda: engine.stats.decode_steps >= 5)
        same = {"model.norm.weight": engine.model.model.norm.weight.detach().clone()}
        await asyncio.to_thread(engine.update_weights, same, 1)  # same weights, but a new epoch
        spanning = await task
        aborted_task = asyncio.create_task(engine.agenerate(_req([9, 8, 7], 150)))
        await wait_until(lambda: engine.stats.decode_steps >= 160)
        engine.abort_all()
        return spanning, await aborted_task

    spanning, aborted = asyncio.run(run())
    assert spanning.output_versions[0] == 0 and spanning.output_versions[-1] == 1
    assert aborted.stop_reason == "abort"
    assert len(engine.prefix_cache) == 0
    # nothing stale to hit: the continuation prefills whole
    engine.generate(_req(_next_turn(spanning, [2]), 4))
    assert engine.stats.prefix_cache_hits == 0


def test_a_failed_step_empties_the_cache(engine, monkeypatch):
    first = engine.generate(_req(PROMPT, 6))
    assert len(engine.prefix_cache) == 1

    def broken(*args, **kwargs):
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(engine._batch, "decode", broken)
    with pytest.raises(RuntimeError, match="injected decode failure"):
        engine.generate(_req([3, 4, 5], 6))
    assert len(engine.prefix_cache) == 0
    monkeypatch.undo()
    engine.generate(_req(_next_turn(first, [2]), 4))
    assert engine.stats.prefix_cache_hits == 0


def test_the_config_knob_sizes_the_cache_and_zero_turns_it_off(tiny_model_path):
    from areal_nb.config import EngineConfig
    from areal_nb.engine import create_engine

    assert EngineConfig().prefix_cache_tokens == LocalEngine.__init__.__kwdefaults__["prefix_cache_tokens"]
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        EngineConfig(prefix_cache_tokens=-1)
    engine = create_engine(EngineConfig(prefix_cache_tokens=0), tiny_model_path, None)
    try:
        first = engine.generate(_req(PROMPT, 4))
        engine.generate(_req(_next_turn(first, [2]), 4))
        assert engine.prefix_cache.max_tokens == 0 and len(engine.prefix_cache) == 0
        assert engine.stats.prefix_cache_hits == 0
    finally:
        engine.close()


def test_drop_caches_frees_the_speed_ups_when_idle_and_nothing_while_busy(engine):
    """`drop_caches` (what a train step calls first): idle, the prefix cache and the lean forward's
    copies of the weights go, and the next request samples what it would have; with a request
    waiting it does nothing."""
    greedy = _req(PROMPT, 12, temperature=0.0)
    first = engine.generate(greedy)
    lean = engine._batch.fast
    assert lean is not None and lean._layers is not None and len(engine.prefix_cache) == 1
    engine.drop_caches()
    assert lean._layers is None and lean._lm_head is None and len(engine.prefix_cache) == 0
    again = engine.generate(greedy)
    assert again.output_tokens == first.output_tokens
    assert again.output_logprobs == pytest.approx(first.output_logprobs, abs=1e-6)
    assert lean._layers is not None and len(engine.prefix_cache) == 1  # rebuilt as requests came

    async def busy():
        engine.pause()
        task = asyncio.create_task(engine.agenerate(_req([3, 4, 5], 4)))
        await wait_until(lambda: bool(engine._waiting))
        engine.drop_caches()  # a request waits: nothing is dropped
        kept = lean._layers is not None and len(engine.prefix_cache) == 1
        engine.resume()
        await task
        return kept

    assert asyncio.run(busy())

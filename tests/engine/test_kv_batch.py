"""`length_groups` (how a prefill is split into forwards over prompts of similar length) and the
running batch's logits against plain forwards."""

from __future__ import annotations

import pytest

from areal_nb.engine.kv_batch import length_groups


def test_similar_lengths_share_a_forward_longest_first():
    # 40 and 32 are within 25 % of 40; 20 is not, and starts its own group with 16
    assert length_groups([20, 40, 16, 32]) == [[1, 3], [0, 2]]


def test_one_length_is_one_group_and_the_token_budget_splits_it():
    assert length_groups([10] * 5) == [[0, 1, 2, 3, 4]]
    assert length_groups([10] * 5, max_tokens=20) == [[0, 1], [2, 3], [4]]


def test_every_row_lands_in_exactly_one_group():
    lengths = [(7 * i) % 61 + 1 for i in range(100)]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(100))
    for group in groups:
        assert min(lengths[i] for i in group) >= 0.75 * max(lengths[i] for i in group)


def _check_and_step(batch, reference_model, rows):
    """`check(logits)`: each row's logits equal a plain forward over its own tokens (1e-4);
    `step(logits)`: append each row's argmax and decode one step. Both read `rows` as it is at
    the call (change it in place as rows leave or join)."""
    import torch

    def check(logits):
        with torch.inference_mode():
            for row, got in zip(rows, logits, strict=True):
                want = reference_model(torch.tensor([row])).logits[0, -1]
                assert (got - want).abs().max() < 1e-4

    def step(logits):
        for row, next_token in zip(rows, logits.argmax(-1).tolist(), strict=True):
            row.append(next_token)
        return batch.decode(torch.tensor([row[-1] for row in rows]))

    return check, step


def test_batch_logits_equal_unpadded_forwards_across_growth_leaving_and_joining(
    tiny_model_path, reference_model
):
    """Rows that decode past the spare columns, leave (trimming padding) and join a running batch
    get the logits of a plain forward over their own unpadded sequence, at every step."""
    import torch

    from areal_nb.engine.kv_batch import SPARE_COLUMNS, PaddedKVBatch
    from areal_nb.engine.weights import load_engine_model

    model, _ = load_engine_model(tiny_model_path, None, torch.device("cpu"), torch.float32)
    batch = PaddedKVBatch(model)
    assert batch.fast is not None
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (3, 17, 9)]

    check, step = _check_and_step(batch, reference_model, rows)

    with torch.inference_mode():
        logits = batch.prefill([list(r) for r in rows])
        check(logits)
        for _ in range(SPARE_COLUMNS + 3):  # the cache buffer grows once on the way
            logits = step(logits)
            check(logits)
        batch.keep_rows([2, 0])  # the longest prompt leaves: padding columns are trimmed
        rows[:], logits = [rows[2], rows[0]], logits[[2, 0]]
        for _ in range(3):
            logits = step(logits)
            check(logits)
        joined = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (40, 2)]
        new_logits = batch.prefill([list(r) for r in joined])  # join the running batch
        rows += joined
        logits = torch.cat([logits, new_logits])
        check(logits)
        for _ in range(5):
            logits = step(logits)
            check(logits)


def test_a_prefill_of_several_forwards_leaves_room_for_the_decoding_steps(tiny_model_path):
    """Prompts of very different lengths, or repeated ones, are prefilled in several forwards and
    joined: the joined cache comes with spare columns, so the decoding steps that follow write
    into it instead of copying the whole cache to grow it."""
    import torch

    from areal_nb.engine.kv_batch import SPARE_COLUMNS, PaddedKVBatch
    from areal_nb.engine.weights import load_engine_model

    model, _ = load_engine_model(tiny_model_path, None, torch.device("cpu"), torch.float32)
    batch = PaddedKVBatch(model)
    with torch.inference_mode():
        batch.prefill([[5, 6, 7, 8], [5, 6, 7, 8], list(range(10, 40))])  # a repeat and a long one
        layer = batch.cache.layers[0]
        assert (batch.length, layer.capacity) == (30, 30 + SPARE_COLUMNS)
        buffer = layer._k
        for _ in range(SPARE_COLUMNS):
            batch.decode(torch.tensor([9, 9, 9]))
        assert layer._k is buffer and batch.length == 30 + SPARE_COLUMNS


def test_compact_order_moves_only_rows_beyond_the_kept_count_into_the_holes():
    from areal_nb.engine.kv_batch import compact_order

    assert compact_order([0, 2, 3, 5]) == [0, 5, 2, 3]  # old row 5 fills slot 1; 0, 2, 3 stay put
    assert compact_order([1, 2]) == [2, 1]
    assert compact_order([0, 1, 2]) == [0, 1, 2]


def test_rows_joining_freed_slots_are_computed_in_place_and_get_unpadded_logits(
    tiny_model_path, reference_model
):
    """Rows leave (the last row moves into a freed slot), then new rows join in the freed slots of
    the same buffers (no copy of the running rows), in packed forwards of a few tokens each: every
    row keeps the logits of a plain forward over its own sequence. The freed slots are filled with
    NaN first: a joining row must clear whatever an earlier row left there."""
    import torch

    from areal_nb.engine.kv_batch import PaddedKVBatch, compact_order
    from areal_nb.engine.weights import load_engine_model

    model, _ = load_engine_model(tiny_model_path, None, torch.device("cpu"), torch.float32)
    batch = PaddedKVBatch(model, max_rows=8)
    batch.prefill_tokens = 16  # several packed forwards per prefill
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (12, 30, 7, 21)]

    check, step = _check_and_step(batch, reference_model, rows)

    with torch.inference_mode():
        logits = batch.prefill([list(r) for r in rows])
        check(logits)
        assert batch.cache.layers[0].row_capacity == 8  # room for twice the rows, up to max_rows
        for _ in range(2):
            logits = step(logits)
        order = compact_order([0, 2, 3])  # row 1 leaves: row 3 moves into its slot
        batch.keep_rows(order)
        rows[:], logits = [rows[i] for i in order], logits[order]
        check(logits)
        buffers = [(layer._k, layer._v) for layer in batch.cache.layers]
        for k, v in buffers:
            k[batch.size :] = float("nan")
            v[batch.size :] = float("nan")
        joined = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (25, 3, 25)]
        joined[2] = list(joined[0])  # a repeated prompt: computed once, copied to its row
        new_logits = batch.prefill([list(r) for r in joined])
        assert batch.relayouts == 0 and all(
            layer._k is k and layer._v is v  # the same buffers
            for layer, (k, v) in zip(batch.cache.layers, buffers, strict=True)
        )
        rows += joined
        logits = torch.cat([logits, new_logits])
        check(logits)
        for _ in range(3):
            logits = step(logits)
            check(logits)


@pytest.mark.parametrize("family", ["mistral", "gemma3", "gemma2"])
def test_a_sliding_window_and_soft_capped_scores_are_kept_by_the_batch(family):
    """Mistral (every layer slides), Gemma 3 (sliding and full layers) and Gemma 2 (soft-capped
    attention scores too: eager attention) with a 4-token window, shorter than every row: the
    running batch's logits equal the model's own forward over each unpadded row, which applies the
    window and the soft-capping."""
    import torch

    from areal_nb.engine.kv_batch import PaddedKVBatch
    from areal_nb.engine.weights import load_engine_model

    from ..train.families import make_family_model

    kw = {"window": 4, "attn_softcap": 50.0 if family == "gemma3" else None}
    reference = make_family_model(family, 100, **kw)
    model, _ = load_engine_model(
        make_family_model(family, 100, **kw), object(), torch.device("cpu"), torch.float32
    )
    batch = PaddedKVBatch(model)
    assert batch.fast is None and batch.window == 4
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (6, 15, 9)]
    check, step = _check_and_step(batch, reference, rows)
    with torch.inference_mode():
        logits = batch.prefill([list(r) for r in rows])
        check(logits)
        for _ in range(6):
            logits = step(logits)
            check(logits)
        joined = [torch.randint(3, 100, (11,), generator=gen).tolist()]
        logits = torch.cat([logits, batch.prefill([list(r) for r in joined])])
        rows += joined
        check(logits)
        for _ in range(3):
            logits = step(logits)
            check(logits)


def test_the_window_changes_the_logits_in_that_check():
    """(Without it the check above could not fail.)"""
    import torch

    from ..train.families import make_family_model

    row = torch.tensor([list(range(3, 18))])
    with torch.inference_mode():
        narrow = make_family_model("mistral", 100, window=4)(row).logits[0, -1]
        wide = make_family_model("mistral", 100, window=4096)(row).logits[0, -1]
    assert (narrow - wide).abs().max() > 1e-3


def test_prefill_token_budget_keeps_the_gate_up_output_under_its_byte_limit():
    """Wide MLPs get fewer tokens per packed prefill forward; small models keep `PREFILL_TOKENS`."""
    from types import SimpleNamespace

    import torch

    from areal_nb.engine.kv_batch import PREFILL_ACTIVATION_BYTES, PREFILL_TOKENS, prefill_token_budget

    qwen = prefill_token_budget(SimpleNamespace(intermediate_size=4864), torch.float32)
    assert qwen == 538 and qwen * 2 * 4864 * 4 <= PREFILL_ACTIVATION_BYTES
    assert prefill_token_budget(SimpleNamespace(intermediate_size=4864), torch.bfloat16) == PREFILL_TOKENS
    assert prefill_token_budget(SimpleNamespace(intermediate_size=1536), torch.float32) == PREFILL_TOKENS
    assert prefill_token_budget(SimpleNamespace(), torch.float32) == PREFILL_TOKENS
    assert prefill_token_budget(SimpleNamespace(intermediate_size=10**9), torch.float32) == 1

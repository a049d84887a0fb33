"""`length_groups` (how a prefill is split into forwards over prompts of similar length) and the
running batch's logits against plain forwards."""

from __future__ import annotations

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


def test_batch_logits_equal_unpadded_forwards_across_growth_leaving_and_joining(tiny_model_path, reference_model):
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

    def check(logits):
        with torch.inference_mode():
            for row, got in zip(rows, logits, strict=True):
                want = reference_model(torch.tensor([row])).logits[0, -1]
                assert (got - want).abs().max() < 1e-4

    def step(logits):
        for row, next_token in zip(rows, logits.argmax(-1).tolist(), strict=True):
            row.append(next_token)
        return batch.decode(torch.tensor([row[-1] for row in rows]))

    with torch.inference_mode():
        logits = batch.prefill([list(r) for r in rows])
        check(logits)
        for _ in range(SPARE_COLUMNS + 3):  # the cache buffer grows once on the way
            logits = step(logits)
            check(logits)
        batch.keep_rows([2, 0])  # the longest prompt leaves: padding columns are trimmed
        rows, logits = [rows[2], rows[0]], logits[[2, 0]]
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

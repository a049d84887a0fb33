"""`length_groups`: how a prefill is split into forwards over prompts of similar length."""

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

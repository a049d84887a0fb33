"""Per-token turn returns: each generated token of a row gets the discounted return of its own turn."""

from __future__ import annotations

import json

import pytest

from areal_nb.capture import InteractionCache, InteractionWithTokenLogpReward
from areal_nb.capture.wire import interactions_from_wire, interactions_to_wire

from .helpers import EOS, assistant, call, user
from .test_interaction import lists, three_turns_and_truncated


def cached(*interactions):
    cache = InteractionCache()
    for it in interactions:
        cache[it.interaction_id] = it
    return cache


def two_turns(template="concat"):
    """A answers (reward 0), the correction prompt follows, B answers (reward 1)."""
    a = call("A", [user("q")], "a", [10, 11], [20, 21, EOS], template=template, reward=0.0)
    b = call(
        "B",
        [user("q"), assistant("a"), user("again")],
        "b",
        [10, 11, 20, 21, EOS, 30],
        [40, EOS],
        parent=a,
        template=template,
        reward=1.0,
    )
    return a, b


def test_two_turn_concat_row_gives_each_turn_its_own_discounted_return():
    a, b = two_turns()
    cache = cached(a, b)
    (leaf,) = cache.export_interactions("concat", reward_discount=0.9).values()
    td = leaf.to_tensor_dict()
    assert leaf is b
    assert td["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 1, 1]]
    assert td["turn_ids"].tolist() == [[-1, -1, 0, 0, 0, -1, 1, 1]]
    # leaf credit: the row's one reward (B's, 1.0) on every generated token
    assert td["rewards"].tolist() == [1.0]
    # turn credit: turn 0 gets 0 + 0.9 × 1 (the tree rule), turn 1 its own 1.0
    assert td["turn_returns"].tolist() == [
        [0.0, 0.0, pytest.approx(0.9), pytest.approx(0.9), pytest.approx(0.9), 0.0, 1.0, 1.0]
    ]


def test_branching_tree_each_row_takes_its_own_branch_of_calls():
    q = [user("q")]
    root = call("root", q, "r", [10], [20, EOS], reward=None)
    a_msgs = q + [assistant("r"), user("A")]
    a = call("a", a_msgs, "a", [10, 20, EOS, 30], [40, EOS], parent=root)
    a1 = call(
        "a1",
        a_msgs + [assistant("a"), user("1")],
        "a1",
        [10, 20, EOS, 30, 40, EOS, 51],
        [61, EOS],
        parent=a,
        reward=1.0,
    )
    a2 = call(
        "a2",
        a_msgs + [assistant("a"), user("2")],
        "a2",
        [10, 20, EOS, 30, 40, EOS, 52],
        [62, EOS],
        parent=a,
        reward=0.0,
    )
    b = call(
        "b", q + [assistant("r"), user("B")], "b", [10, 20, EOS, 31], [41, 42, EOS], parent=root, reward=0.5
    )
    cache = cached(root, a, a1, a2, b)
    leaves = cache.export_interactions("concat", reward_discount=0.5)
    assert list(leaves) == ["a1", "a2", "b"]
    # tree rule, γ = 0.5: a = 0.5·mean(1, 0) = 0.25, root = 0.5·mean(0.25, 0.5) = 0.1875
    r, x = 0.1875, 0.25
    assert leaves["a1"].to_tensor_dict()["turn_returns"].tolist() == [[0, r, r, 0, x, x, 0, 1.0, 1.0]]
    assert leaves["a2"].to_tensor_dict()["turn_returns"].tolist() == [[0, r, r, 0, x, x, 0, 0.0, 0.0]]
    assert leaves["b"].to_tensor_dict()["turn_returns"].tolist() == [[0, r, r, 0, 0.5, 0.5, 0.5]]
    assert [leaves[k].to_tensor_dict()["rewards"].item() for k in leaves] == [1.0, 0.0, 0.5]


def test_length_truncated_turn_gets_its_return_and_the_added_eos_none():
    a, b, c, d = three_turns_and_truncated()  # C stopped on length: D's prompt adds an EOS after it
    cache = cached(a, b, c, d)
    cache.set_reward("B", 0.5)
    cache.set_reward("D", 1.0)
    cache.apply_reward_discount(0.5)
    # D = 1, C (truncated, no reward) = 0.5·1, B = 0.5 + 0.5·0.5, A = 0.5·0.75
    assert [it.reward for it in (a, b, c, d)] == [0.375, 0.75, 0.5, 1.0]
    td = d.to_tensor_dict()
    assert td["turn_ids"].tolist() == [[-1, -1, -1, 0, 0, 0, -1, -1, 1, 1, -1, 2, 2, 2, -1, -1, 3, 3]]
    assert td["turn_returns"].tolist() == [
        [0, 0, 0, 0.375, 0.375, 0.375, 0, 0, 0.75, 0.75, 0, 0.5, 0.5, 0.5, 0, 0, 1.0, 1.0]
    ]
    # the truncated call's own row: its three tokens, nothing after them
    assert c.to_tensor_dict()["turn_returns"].tolist()[0][-4:] == [0.0, 0.5, 0.5, 0.5]


def test_individual_export_of_hf_calls_is_unchanged_and_turn_returns_equal_the_row_reward():
    calls = three_turns_and_truncated(template="hf")
    cache = cached(*calls)
    cache.set_reward("B", 0.5)
    cache.set_reward("D", 1.0)
    exported = cache.export_interactions("individual", reward_discount=0.5)
    expected_loss_masks = {
        "A": [0] * 3 + [1] * 3,
        "B": [0] * 8 + [1] * 2,
        "C": [0] * 11 + [1] * 3,
        "D": [0] * 16 + [1] * 2,
    }
    for key, it in exported.items():
        td = lists(it.to_tensor_dict())
        assert td["loss_mask"] == [expected_loss_masks[key]]
        assert td["input_ids"] == [
            list(it.model_response.input_tokens) + list(it.model_response.output_tokens)
        ]
        assert td["turn_returns"] == [[td["rewards"][0] * m for m in expected_loss_masks[key]]]
    assert [it.reward for it in exported.values()] == [0.375, 0.75, 0.5, 1.0]


def test_override_rewards_by_id_without_touching_the_interactions():
    a, b = two_turns()
    assert b.turn_returns({"A": 0.25, "B": 2.0}) == [0, 0, 0.25, 0.25, 0.25, 0, 2.0, 2.0]
    assert b.turn_returns() == [0, 0, 0.0, 0.0, 0.0, 0, 1.0, 1.0]  # not discounted yet: rewards as set
    assert (a.reward, b.reward) == (0.0, 1.0)


def test_wire_keeps_turn_returns_with_and_without_the_parents():
    a, b = two_turns()
    cache = cached(a, b)
    exported = cache.export_interactions("concat", reward_discount=0.9)
    rebuilt = interactions_from_wire(json.loads(json.dumps(interactions_to_wire(exported))))
    assert (
        rebuilt["B"].to_tensor_dict()["turn_returns"].tolist() == b.to_tensor_dict()["turn_returns"].tolist()
    )
    alone = InteractionWithTokenLogpReward.from_wire(json.loads(json.dumps(b.to_wire())), {})
    assert alone.parent is None
    assert alone.to_tensor_dict()["turn_returns"].tolist() == b.to_tensor_dict()["turn_returns"].tolist()
    wire = json.loads(json.dumps(b.to_wire()))
    del wire["tensor_dict"]["turn_returns"]
    without = InteractionWithTokenLogpReward.from_wire(wire, {})
    with pytest.raises(ValueError, match=r"no call known for turn\(s\) \[0\]"):
        without.turn_returns()

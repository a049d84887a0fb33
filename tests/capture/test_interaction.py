"""Training rows of single interactions: exact tensors in hf and concat mode, wire format."""

from __future__ import annotations

import json

import pytest
import torch

from areal_nb.capture import InteractionCache, InteractionWithTokenLogpReward, concat_padded_tensors
from areal_nb.capture.wire import interactions_from_wire, interactions_to_wire

from .helpers import EOS, PAD, call, user


def three_turns_and_truncated(template="concat"):
    """A → B (after a tool result) → C (truncated by length) → D (after a user turn)."""
    q = [user("q")]
    a = call("A", q, "a", [10, 11, 12], [20, 21, EOS], template=template, logprob=-0.1, version=0)
    b_msgs = q + [
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ]
    b = call(
        "B",
        b_msgs,
        "b",
        [10, 11, 12, 20, 21, EOS, 30, 31],
        [40, EOS],
        parent=a,
        template=template,
        logprob=-0.2,
        version=1,
    )
    c_msgs = b_msgs + [{"role": "assistant", "content": "b"}, user("u")]
    c = call(
        "C",
        c_msgs,
        "c",
        [10, 11, 12, 20, 21, EOS, 30, 31, 40, EOS, 50],
        [60, 61, 62],
        parent=b,
        template=template,
        stop_reason="length",
        logprob=-0.3,
        version=2,
    )
    d_msgs = c_msgs + [{"role": "assistant", "content": "c"}, user("v")]
    d = call(
        "D",
        d_msgs,
        "d",
        [10, 11, 12, 20, 21, EOS, 30, 31, 40, EOS, 50, 60, 61, 62, EOS, 70],
        [80, EOS],
        parent=c,
        template=template,
        logprob=-0.4,
        version=3,
    )
    return a, b, c, d


def lists(td):
    return {k: v.tolist() for k, v in td.items()}


def test_concat_row_of_a_four_turn_chain_with_tool_result_and_truncated_parent():
    *_, d = three_turns_and_truncated()
    d.reward = 1.5
    td = d.to_tensor_dict()
    assert lists(td) == {
        "input_ids": [[10, 11, 12, 20, 21, 2, 30, 31, 40, 2, 50, 60, 61, 62, 2, 70, 80, 2]],
        "loss_mask": [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1]],
        "logprobs": [
            [0.0, 0.0, 0.0]
            + [pytest.approx(-0.1)] * 3
            + [0.0, 0.0]
            + [pytest.approx(-0.2)] * 2
            + [0.0]
            + [pytest.approx(-0.3)] * 3
            + [0.0, 0.0]
            + [pytest.approx(-0.4)] * 2
        ],
        "versions": [[-1, -1, -1, 0, 0, 0, -1, -1, 1, 1, -1, 2, 2, 2, -1, -1, 3, 3]],
        "turn_ids": [[-1, -1, -1, 0, 0, 0, -1, -1, 1, 1, -1, 2, 2, 2, -1, -1, 3, 3]],
        "attention_mask": [[True] * 18],
        "rewards": [1.5],
        # no call of the chain but D has a reward: earlier turns' tokens get 0.0, D's get 1.5
        "turn_returns": [[0.0] * 16 + [1.5, 1.5]],
    }
    assert {k: v.dtype for k, v in td.items()} == {
        "input_ids": torch.int64,
        "loss_mask": torch.int64,
        "logprobs": torch.float32,
        "versions": torch.int64,
        "turn_ids": torch.int64,
        "attention_mask": torch.bool,
        "rewards": torch.float32,
        "turn_returns": torch.float32,
    }
    assert td["rewards"].shape == (1,) and td["input_ids"].shape == (1, 18)


def test_hf_rows_hold_only_their_own_call_with_turn_depth():
    a, b, c, _ = three_turns_and_truncated(template="hf")
    assert lists(b.to_tensor_dict())["loss_mask"] == [[0] * 8 + [1, 1]]
    assert lists(b.to_tensor_dict())["turn_ids"] == [[-1] * 8 + [1, 1]]
    assert lists(b.to_tensor_dict())["versions"] == [[-1] * 8 + [1, 1]]
    assert lists(c.to_tensor_dict())["turn_ids"] == [[-1] * 11 + [2, 2, 2]]
    assert lists(a.to_tensor_dict())["input_ids"] == [[10, 11, 12, 20, 21, 2]]
    assert lists(a.to_tensor_dict())["logprobs"] == [[0.0] * 3 + [pytest.approx(-0.1)] * 3]
    assert lists(a.to_tensor_dict())["rewards"] == [0.0]


def test_parent_ending_with_eos_and_pad_keeps_its_eos_and_drops_the_pad():
    a = call("A", [user("q")], "a", [10], [20, EOS, PAD])
    b = call(
        "B",
        [user("q"), {"role": "assistant", "content": "a"}, user("u")],
        "b",
        [10, 20, EOS, 30],
        [40, EOS],
        parent=a,
    )
    assert lists(b.to_tensor_dict())["loss_mask"] == [[0, 1, 1, 0, 1, 1]]
    assert lists(b.to_tensor_dict())["input_ids"] == [[10, 20, EOS, 30, 40, EOS]]


def test_stop_string_parent_without_eos_gets_the_added_eos_masked():
    a = call("A", [user("q")], "a", [10], [20, 21], stop_reason="stop")  # stopped on a stop string
    b = call(
        "B",
        [user("q"), {"role": "assistant", "content": "a"}, user("u")],
        "b",
        [10, 20, 21, EOS, 30],
        [40],
        parent=a,
    )
    assert lists(b.to_tensor_dict())["loss_mask"] == [[0, 1, 1, 0, 0, 1]]


def test_child_whose_prompt_does_not_start_with_the_parent_row_is_refused():
    a = call("A", [user("q")], "a", [10, 11], [20, EOS])
    b = call("B", [user("q")], "b", [10, 99, 20, EOS, 30], [40, EOS], parent=a)
    with pytest.raises(
        ValueError, match="does not start with its parent's tokens .first difference at token 1"
    ):
        b.to_tensor_dict()


def test_rewards_are_read_when_the_dict_is_built():
    *_, d = three_turns_and_truncated()
    assert d.to_tensor_dict()["rewards"].tolist() == [0.0]
    d.reward = 2.0
    assert d.to_tensor_dict()["rewards"].tolist() == [2.0]


def test_mismatched_logprob_count_is_a_clear_error():
    a = call("A", [user("q")], "a", [10], [20, EOS])
    a.model_response.output_logprobs = [-0.1]
    with pytest.raises(ValueError, match="2 output tokens but 1 log-probs and 2 versions"):
        a.to_tensor_dict()


def test_interaction_without_tokens_has_no_tensor_dict():
    it = InteractionWithTokenLogpReward(messages=[user("q")], _interaction_id="x")
    with pytest.raises(ValueError, match="no model_response"):
        it.to_tensor_dict()


@pytest.mark.parametrize("bad", [True, "1", None])
def test_bad_reward_types_are_refused(bad):
    with pytest.raises(TypeError):
        InteractionWithTokenLogpReward(reward=bad if bad is not None else object())


def test_int_reward_is_accepted_and_stored_as_float():
    assert InteractionWithTokenLogpReward(reward=1).reward == 1.0


def test_concat_padded_tensors_right_pads_rows():
    a, b, *_ = three_turns_and_truncated()
    a.reward, b.reward = 1, 0.5
    batch = concat_padded_tensors([a.to_tensor_dict(), b.to_tensor_dict()])
    assert batch["input_ids"].tolist() == [
        [10, 11, 12, 20, 21, 2, 0, 0, 0, 0],
        [10, 11, 12, 20, 21, 2, 30, 31, 40, 2],
    ]
    assert batch["attention_mask"].tolist() == [[True] * 6 + [False] * 4, [True] * 10]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]]
    assert batch["turn_ids"].tolist()[0] == [-1, -1, -1, 0, 0, 0, -1, -1, -1, -1]
    assert batch["rewards"].tolist() == [1.0, 0.5]
    assert batch["rewards"].shape == (2,)
    assert concat_padded_tensors([]) == {}


def test_wire_round_trip_keeps_rows_rewards_and_parent_links():
    cache = InteractionCache()
    for it in three_turns_and_truncated():
        cache[it.interaction_id] = it
    cache.set_reward("D", 1)
    cache.apply_reward_discount(0.5)
    for style in ("individual", "concat"):
        exported = cache.export_interactions(style)
        payload = json.loads(json.dumps(interactions_to_wire(exported)))
        rebuilt = interactions_from_wire(payload)
        assert list(rebuilt) == list(exported)
        for key, it in exported.items():
            assert lists(rebuilt[key].to_tensor_dict()) == lists(it.to_tensor_dict())
            assert rebuilt[key].parent_id == it.parent_id
            assert rebuilt[key].reward == it.reward and rebuilt[key].raw_reward == it.raw_reward
        assert rebuilt["D"].parent.parent.interaction_id == "B"


def test_from_wire_in_export_order_without_parents_keeps_the_exported_row():
    *_, d = three_turns_and_truncated()
    wire = json.loads(json.dumps(d.to_wire()))
    rebuilt = InteractionWithTokenLogpReward.from_wire(wire, {})
    assert rebuilt.parent is None and rebuilt.parent_id == "C"
    assert lists(rebuilt.to_tensor_dict()) == lists(d.to_tensor_dict())
    assert wire["model_response"]["output_tokens"] == [80, EOS]
    assert wire["tensor_dict"]["loss_mask"] == d.to_tensor_dict()["loss_mask"][0].tolist()

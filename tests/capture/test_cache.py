"""Parent resolution, reward setting, reward discount (tree and linear) and export styles."""

from __future__ import annotations

import warnings

import pytest

from areal_nb.capture import (
    ConversationLinkWarning,
    IncompleteInteractionWarning,
    InteractionCache,
    InteractionWithTokenLogpReward,
    MissingRewardWarning,
)
from areal_nb.capture.cache import discounted_rewards

from .helpers import assistant, call, user


def add(cache, iid, messages, out, reward=None, template="concat"):
    it = call(iid, messages, out, reward=reward, template=template)
    cache[iid] = it
    return it


def chain(cache, n=3):
    msgs = [user("q")]
    items = []
    for i in range(n):
        items.append(add(cache, f"c{i}", msgs, f"a{i}"))
        msgs = msgs + [assistant(f"a{i}"), user(f"u{i}")]
    return items


# ----- parent resolution ----------------------------------------------------------------------
def test_longest_prefix_wins():
    cache = InteractionCache()
    a = add(cache, "a", [user("q")], "x")
    b = add(cache, "b", [user("q"), assistant("x"), user("more")], "y")
    c = add(cache, "c", [user("q"), assistant("x"), user("more"), assistant("y"), user("again")], "z")
    assert (a.parent, b.parent, c.parent) == (None, a, b)


def test_branches_link_to_their_own_parent():
    cache = InteractionCache()
    a1 = add(cache, "a1", [user("q")], "x")
    a2 = add(cache, "a2", [user("q")], "other")
    b = add(cache, "b", [user("q"), assistant("other"), user("u")], "y")
    assert a1.parent is None and a2.parent is None and b.parent is a2


def test_in_flight_calls_are_never_parents():
    cache = InteractionCache()
    pending = InteractionWithTokenLogpReward(
        messages=[user("q")], chat_template_type="concat", _interaction_id="p"
    )
    cache["p"] = pending
    child = call("c", [user("q"), assistant("x"), user("u")], "y")
    cache["c"] = child
    assert child.parent is None


def test_edited_assistant_message_breaks_the_link_with_a_warning():
    cache = InteractionCache()
    add(cache, "a", [user("q")], "<think>123</think> B")
    with pytest.warns(ConversationLinkWarning, match="interaction a"):
        b = add(cache, "b", [user("q"), assistant("B"), user("u")], "y")
    assert b.parent is None


def test_sdk_message_objects_and_their_dumps_link_alike():
    from openai.types.chat import ChatCompletionMessage

    from areal_nb.capture import normalize_messages

    msgs = normalize_messages(
        [{"role": "user", "content": "q"}, ChatCompletionMessage(role="assistant", content="x")]
    )
    cache = InteractionCache()
    a = add(cache, "a", [user("q")], "x")
    b = add(cache, "b", msgs + [user("u")], "y")
    assert b.parent is a


def _tool_call_output(cache, iid="a"):
    """A completed call whose output is a tool call, recorded the way the completion records it."""
    it = call(iid, [user("add 1 and 2")], "")
    it.output_message_list = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        }
    ]
    cache[iid] = it
    return it


TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "3"}


@pytest.mark.parametrize(
    "echo",
    [
        # the OpenAI Agents SDK: no content key on a tool-call message
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
        # a streaming client that accumulated deltas: content None, each call keeps its index
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
        # a framework that parsed the arguments and dumped them again, without the type
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}],
        },
        # a client that keeps empty fields of the SDK object
        {
            "role": "assistant",
            "content": [],
            "annotations": [],
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
    ],
    ids=["agents-sdk", "stream-accumulated", "reserialised", "empty-fields"],
)
def test_echoed_tool_call_message_in_another_spelling_still_links(echo):
    cache = InteractionCache()
    a = _tool_call_output(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = add(cache, "b", [user("add 1 and 2"), echo, TOOL_RESULT], "The sum is 3")
    assert b.parent is a


def test_text_parts_echo_links_but_a_different_call_or_text_does_not():
    cache = InteractionCache()
    a = add(cache, "a", [user("q")], "x y")
    parts = {"role": "assistant", "content": [{"type": "text", "text": "x "}, {"type": "text", "text": "y"}]}
    assert add(cache, "b", [user("q"), parts, user("u")], "z").parent is a
    c = _tool_call_output(cache, "c")
    other_args = {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 5}'}}
        ],
    }
    with pytest.warns(ConversationLinkWarning, match="interaction c"):
        d = add(cache, "d", [user("add 1 and 2"), other_args, TOOL_RESULT], "y")
    assert d.parent is None and c.parent is None
    with pytest.warns(ConversationLinkWarning, match="interaction a"):
        assert add(cache, "e", [user("q"), assistant("x  y"), user("u")], "z").parent is None


def test_unrelated_conversation_has_no_parent_and_no_warning():
    cache = InteractionCache()
    add(cache, "a", [user("q")], "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = add(cache, "b", [user("other")], "y")
    assert b.parent is None


def test_duplicate_id_is_refused():
    cache = InteractionCache()
    add(cache, "a", [user("q")], "x")
    with pytest.raises(ValueError, match="already in the cache"):
        add(cache, "a", [user("q")], "x")


# ----- rewards ----------------------------------------------------------------------------------
def test_set_reward_accepts_int_and_refuses_bool_and_unknown_ids():
    cache = InteractionCache()
    add(cache, "a", [user("q")], "x")
    cache.set_reward("a", 10)
    assert cache["a"].reward == 10.0 and isinstance(cache["a"].reward, float)
    with pytest.raises(TypeError):
        cache.set_reward("a", True)
    with pytest.raises(ValueError, match="finite"):
        cache.set_reward("a", float("nan"))
    with pytest.raises(KeyError, match="not found"):
        cache.set_reward("zzz", 1.0)


def test_set_last_reward_targets_the_most_recently_completed_call():
    cache = InteractionCache()
    first = add(cache, "first", [user("q")], "x")
    pending = InteractionWithTokenLogpReward(messages=[user("r")], _interaction_id="pending")
    cache["pending"] = pending  # started later, still running
    assert cache.set_last_reward(20) == "first"
    assert first.reward == 20.0 and pending.reward is None
    pending.output_message_list = [assistant("y")]
    cache.mark_completed("pending")
    assert cache.set_last_reward(3) == "pending"


def test_set_last_reward_on_empty_cache_raises():
    with pytest.raises(RuntimeError, match="No completed interaction"):
        InteractionCache().set_last_reward(1.0)


# ----- discount ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["tree", "linear"])
def test_linear_chain_only_last_rewarded(mode):
    cache = InteractionCache()
    a, b, c = chain(cache)
    c.reward = 1.0
    cache.apply_reward_discount(0.9, mode=mode)
    assert [a.reward, b.reward, c.reward] == pytest.approx([0.81, 0.9, 1.0])
    assert [a.raw_reward, b.raw_reward, c.raw_reward] == [0.0, 0.0, 1.0]  # unset counts as 0.0


@pytest.mark.parametrize("mode", ["tree", "linear"])
def test_linear_chain_with_rewards_on_inner_nodes(mode):
    cache = InteractionCache()
    a, b, c = chain(cache)
    a.reward, c.reward = 1.0, 2.0  # b unset counts as 0
    cache.apply_reward_discount(0.9, mode=mode)
    assert [a.reward, b.reward, c.reward] == pytest.approx([1.0 + 0.9 * 1.8, 1.8, 2.0])


def test_tree_mode_averages_children_and_keeps_roots_apart():
    cache = InteractionCache()
    root = add(cache, "root", [user("q")], "r")
    a = add(cache, "a", [user("q"), assistant("r"), user("A")], "a")
    a1 = add(cache, "a1", [user("q"), assistant("r"), user("A"), assistant("a"), user("1")], "a1", reward=1.0)
    a2 = add(cache, "a2", [user("q"), assistant("r"), user("A"), assistant("a"), user("2")], "a2", reward=0.0)
    b = add(cache, "b", [user("q"), assistant("r"), user("B")], "b", reward=0.5)
    other = add(cache, "other", [user("separate")], "o", reward=3.0)
    assert (a1.parent, a2.parent, b.parent, a.parent) == (a, a, root, root)
    cache.apply_reward_discount(0.5)
    assert a.reward == pytest.approx(0.5 * 0.5)  # mean(1, 0) discounted
    assert b.reward == pytest.approx(0.5)
    assert root.reward == pytest.approx(0.5 * (0.25 + 0.5) / 2)
    assert other.reward == 3.0 and (a1.reward, a2.reward) == (1.0, 0.0)


def test_linear_mode_reproduces_insertion_order_leak_between_roots():
    cache = InteractionCache()
    first = add(cache, "x", [user("one")], "x", reward=1.0)
    add(cache, "y", [user("two")], "y", reward=2.0)
    cache.apply_reward_discount(0.5, mode="linear")
    assert first.reward == pytest.approx(2.0)  # AReaL leaks 0.5 * 2.0 into an unrelated call


def test_discount_twice_is_refused_in_either_mode():
    cache = InteractionCache()
    chain(cache)[-1].reward = 1.0
    cache.apply_reward_discount(0.9, mode="linear")
    with pytest.raises(RuntimeError, match="should only be called once"):
        cache.apply_reward_discount(0.9)
    with pytest.raises(ValueError, match="Invalid reward discount mode"):
        InteractionCache().apply_reward_discount(0.9, mode="zigzag")


def test_unset_leaf_reward_warns_and_counts_zero():
    cache = InteractionCache()
    a, b = chain(cache, 2)
    a.reward = 1.0
    with pytest.warns(MissingRewardWarning, match="c1"):
        cache.apply_reward_discount(0.9)
    assert (a.reward, b.reward) == (1.0, 0.0)


def test_discounted_rewards_is_pure_and_takes_override_rewards():
    cache = InteractionCache()
    a, b, c = chain(cache)
    out = discounted_rewards([a, b, c], 0.5, "tree", rewards={"c2": 4.0})
    assert out == {"c0": 1.0, "c1": 2.0, "c2": 4.0}
    assert (a.reward, b.reward, c.reward) == (None, None, None)


# ----- export -----------------------------------------------------------------------------------
def test_export_styles_individual_and_concat_leaves():
    cache = InteractionCache()
    i1 = add(cache, "i1", [user("q")], "x")
    add(cache, "i2", [user("q"), assistant("x"), user("u")], "y")
    i3 = add(cache, "i3", [user("q")], "different")
    i4 = add(cache, "i4", [user("q"), assistant("x"), user("u"), assistant("y"), user("v")], "z")
    assert set(cache.export_interactions("concat")) == {"i3", "i4"}
    assert list(cache.export_interactions("individual")) == ["i1", "i2", "i3", "i4"]
    assert set(cache.export_interactions("concat")) == {"i3", "i4"}  # repeatable
    assert i4.parent.parent is i1 and i3.parent is None


def test_export_skips_incomplete_calls_with_a_warning():
    cache = InteractionCache()
    add(cache, "a", [user("q")], "x")
    cache["p"] = InteractionWithTokenLogpReward(
        messages=[user("q")], chat_template_type="concat", _interaction_id="p"
    )
    with pytest.warns(IncompleteInteractionWarning, match="p"):
        assert list(cache.export_interactions("concat")) == ["a"]


def test_export_errors():
    cache = InteractionCache()
    assert cache.export_interactions("concat") == {}
    add(cache, "h", [user("q")], "x", template="hf")
    with pytest.raises(ValueError, match="Cannot export interactions in 'concat' style"):
        cache.export_interactions("concat")
    with pytest.raises(ValueError, match="Invalid export style"):
        cache.export_interactions("tree")
    assert list(cache.export_interactions("individual")) == ["h"]


def test_export_with_reward_discount_applies_it_once():
    cache = InteractionCache()
    a, _, c = chain(cache)
    c.reward = 10.0
    out = cache.export_interactions("individual", reward_discount=0.9)
    assert [out[k].reward for k in ("c0", "c1", "c2")] == pytest.approx([8.1, 9.0, 10.0])
    cache.export_interactions("individual", reward_discount=0.9)
    assert a.reward == pytest.approx(8.1)

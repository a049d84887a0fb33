"""Tree view model on real captured calls (tiny-math through ArealOpenAI)."""

from __future__ import annotations

import copy

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionCache, InteractionWithTokenLogpReward
from areal_nb.widgets import build_tree
from areal_nb.widgets.render import tree_svg

from .conftest import episode


def test_branching_tree_layout_and_node_contents(captured):
    cache = captured.branching
    ids = list(cache)
    tree = build_tree(cache)
    assert [n.id for n in tree.nodes] == ids
    assert tree.roots == [ids[0], ids[3]]  # two roots, side by side in call order
    assert sorted(tree.edges) == sorted([(ids[0], ids[1]), (ids[0], ids[2])])
    root, child_a, child_b, other = (tree.node(i) for i in ids)
    # leaves take columns 0, 1 (children of the first root), 2 (second root); parents centre over them
    assert (child_a.x, child_b.x, other.x, root.x) == (0, 1, 2, 0.5)
    assert (root.y, child_a.y, child_b.y, other.y) == (0, 1, 1, 0)
    assert tree.columns == 3 and tree.rows == 2
    for node, call in zip(tree.nodes, cache.values(), strict=True):
        mr = call.model_response
        assert node.tokens_in == len(mr.input_tokens) and node.tokens_out == len(mr.output_tokens)
        assert (node.version_min, node.version_max) == (0, 0) and node.versions == "v0"
        assert node.pending is False and node.concat_leaf is False  # hf calls are never concat rows
        assert node.reply == (call.output_message_list[0].get("content") or "")
        assert node.chat_template_type == "hf"
    assert child_a.roles == "user" and root.roles == "user"
    assert (child_a.reward_raw, child_b.reward_raw, root.reward_raw) == (0.0, 1.0, None)
    assert child_a.depth == 1 and child_a.label == "turn 1"


def test_concat_leaf_marked_and_rewards_before_and_after_discount(captured):
    first_id, second_id = list(captured.concat_a)
    tree = build_tree(episode(captured.concat_a))
    first, second = tree.node(first_id), tree.node(second_id)
    assert (first.concat_leaf, second.concat_leaf) == (False, True)
    assert (first.reward_raw, first.reward) == (0.0, 0.0)
    assert (second.reward_raw, second.reward) == (1.0, 1.0)
    assert "concat leaf" in second.title and "reward set: 0" in first.title
    svg = tree_svg(tree)
    assert svg.count('class="anb-node') == 2 and svg.count('class="anb-edge"') == 1
    assert svg.count("anb-leaf") == 1 and 'data-nodes="2"' in svg


def test_discounted_episode_shows_reward_as_set_and_after(captured):
    # Re-play the rewards onto fresh copies so the shared fixture stays undiscounted.
    src = list(captured.concat_a.values())
    cache = InteractionCache()
    first = copy.copy(src[0])
    first.reward, first.raw_reward = 0.0, None
    second = copy.copy(src[1])
    second.parent, second.reward, second.raw_reward = first, 1.0, None
    cache[first.interaction_id] = first
    cache[second.interaction_id] = second
    cache.apply_reward_discount(0.5, mode="tree")
    tree = build_tree(cache)
    n1, n2 = tree.node(first.interaction_id), tree.node(second.interaction_id)
    assert (n1.reward_raw, n1.reward) == (0.0, 0.5)
    assert (n2.reward_raw, n2.reward) == (1.0, 1.0)


def test_pending_call_is_drawn_and_fills_in(tiny_tokenizer):
    cache = InteractionCache()
    root = InteractionWithTokenLogpReward(
        model_response=ModelResponse(
            [1, 5, 6], [7, 8, 2], [-0.1, -0.2, -0.3], [3, 4, 4], tokenizer=tiny_tokenizer
        ),
        messages=[{"role": "user", "content": "hi"}],
        output_message_list=[{"role": "assistant", "content": "hello there"}],
        _interaction_id="root",
    )
    cache["root"] = root
    in_flight = InteractionWithTokenLogpReward(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "more"},
        ],
        _interaction_id="child",
    )
    cache["child"] = in_flight
    tree = build_tree(cache)
    child = tree.node("child")
    assert child.pending and child.parent_id == "root" and child.preview == "…"
    assert child.tokens_in is None and child.tokens_out is None and tree.n_pending == 1
    assert tree.node("root").versions == "v3–4" and tree.node("root").preview == "hello there"
    assert 'data-pending="1"' in tree_svg(tree) and "stroke-dasharray" in tree_svg(tree)
    in_flight.model_response = ModelResponse(
        [1, 5, 6, 7, 8, 2, 9], [10, 2], [-1.0, -0.5], [5, 5], tokenizer=tiny_tokenizer
    )
    in_flight.output_message_list = [{"role": "assistant", "content": "ok"}]
    child = build_tree(cache).node("child")
    assert not child.pending and (child.tokens_in, child.tokens_out, child.versions) == (7, 2, "v5")

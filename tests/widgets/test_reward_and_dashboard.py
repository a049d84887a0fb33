"""Reward view states (slider γ, tree/linear) and dashboard series on real captured calls."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest

from areal_nb.capture import InteractionCache
from areal_nb.widgets import RewardSource, history_series, reward_state, show_rewards
from areal_nb.widgets.dashboard_model import METRICS
from areal_nb.widgets.render import dashboard_html

from .conftest import episode

EPS = 1e-5


def group_of(captured):
    return [episode(captured.concat_a, 0, 0), episode(captured.concat_b, 0, 1)]


def test_concat_group_states_for_two_discounts(captured):
    a1, a2 = captured.concat_a.values()
    b1, b2 = captured.concat_b.values()
    group = group_of(captured)
    src = RewardSource.from_any(group[0], group=group)
    half = reward_state(src, 0.5, "tree")
    assert half.style == "concat" and half.focus == 0
    assert [(n.id, n.raw, n.discounted, n.exported) for n in half.nodes] == [
        (a1.interaction_id, 0.0, 0.5, False),
        (a2.interaction_id, 1.0, 1.0, True),
        (b1.interaction_id, 0.5, 0.5, False),
        (b2.interaction_id, 0.0, 0.0, True),
    ]
    # concat rows are the leaves: rewards 1 and 0 → ±0.5 / (unbiased std √0.5 + eps)
    adv = 0.5 / (math.sqrt(0.5) + EPS)
    assert [(r.interaction_id, r.sample_id, r.reward) for r in half.rows] == [
        (a2.interaction_id, 0, 1.0),
        (b2.interaction_id, 1, 0.0),
    ]
    assert [r.advantage for r in half.rows] == pytest.approx([adv, -adv], abs=1e-6)
    zero = reward_state(src, 0.0, "tree", style="individual")
    assert [n.discounted for n in zero.nodes] == [0.0, 1.0, 0.5, 0.0]
    assert len(zero.rows) == 4
    mean = 0.375
    std = math.sqrt(sum((r - mean) ** 2 for r in [0.0, 1.0, 0.5, 0.0]) / 3)
    assert [r.advantage for r in zero.rows] == pytest.approx(
        [(r - mean) / (std + EPS) for r in [0.0, 1.0, 0.5, 0.0]], abs=1e-6
    )


@pytest.mark.parametrize("mode", ["tree", "linear"])
@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0])
def test_recompute_equals_applying_the_discount_to_the_cache(captured, mode, gamma):
    src = RewardSource.from_any(episode(captured.branching))
    state = reward_state(src, gamma, mode)
    fresh = InteractionCache()
    clones = {}
    for key, value in captured.branching.items():  # copies: the fixture's rewards stay as set
        clone = copy.copy(value)
        clone.parent = clones.get(value.parent.interaction_id) if value.parent is not None else None
        clones[key] = clone
        fresh[key] = clone
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh.apply_reward_discount(gamma, mode=mode)
    assert {n.id: n.discounted for n in state.nodes} == pytest.approx({k: v.reward for k, v in fresh.items()})


def test_tree_and_linear_differ_on_a_branching_episode(captured):
    root, child_a, child_b, other = captured.branching
    src = RewardSource.from_any(episode(captured.branching))
    tree = {n.id: n.discounted for n in reward_state(src, 1.0, "tree").nodes}
    linear = {n.id: n.discounted for n in reward_state(src, 1.0, "linear").nodes}
    assert [tree[k] for k in (root, child_a, child_b, other)] == [0.5, 0.0, 1.0, 0.0]
    assert [linear[k] for k in (root, child_a, child_b, other)] == [1.0, 1.0, 1.0, 0.0]


def test_reward_widget_recomputes_when_slider_moves(captured):
    group = group_of(captured)
    view = show_rewards(group[0], group=group, discount=1.0, live=False)
    first = list(captured.concat_a)[0]
    assert view.state.node(first).discounted == 1.0 and 'data-gamma="1"' in view.body.value
    view.slider.value = 0.5
    assert view.state.node(first).discounted == 0.5 and 'data-gamma="0.5"' in view.body.value
    view.mode_toggle.value = "linear"
    assert view.state.mode == "linear" and 'data-mode="linear"' in view.body.value
    assert "text/html" in view._repr_mimebundle_() and "anb-adv-row" in view._repr_mimebundle_()["text/html"]
    view.close()


def test_dashboard_series_skip_unmeasured_points():
    history = pd.DataFrame(
        [
            {"step": 1, "reward_mean": 0.25, "eval_accuracy": float("nan"), "loss": 0.5},
            {"step": 2, "reward_mean": 0.5, "eval_accuracy": 0.1, "loss": 0.25},
        ]
    )
    series = {s.column: s for s in history_series(history)}
    assert set(series) == {"reward_mean", "eval_accuracy", "loss"}
    assert series["reward_mean"].points == [(1, 0.25), (2, 0.5)]
    assert series["eval_accuracy"].points == [(2, 0.1)] and series["eval_accuracy"].last == 0.1
    html = dashboard_html(list(series.values()), 2)
    assert 'data-metric="reward_mean" data-points="2"' in html
    assert 'data-metric="eval_accuracy" data-points="1"' in html and html.count('class="anb-pt"') == 5
    assert len(history_series(pd.DataFrame())) == len(METRICS)  # empty history: every metric, no points


def test_a_group_of_equal_rewards_is_shown_as_carrying_no_signal(captured):
    from areal_nb.widgets.render import reward_html

    group = group_of(captured)
    mixed = reward_state(RewardSource.from_any(group[0], group=group), 1.0, "tree")
    assert not mixed.zero_signal and "anb-zero-signal" not in reward_html(mixed)
    every_call = [
        x.interaction_id for cache in (captured.concat_a, captured.concat_b) for x in cache.values()
    ]
    equal = RewardSource.from_any(group[0], group=group, raw_rewards=dict.fromkeys(every_call, 1.0))
    state = reward_state(equal, 1.0, "tree")
    assert state.zero_signal and [r.advantage for r in state.rows] == [0.0, 0.0]
    html = reward_html(state)
    assert (
        html.count('class="anb-zero-signal"') == 1 and "every row of this group has the same reward" in html
    )


def test_the_dashboard_warns_while_most_groups_carry_no_signal():
    from types import SimpleNamespace

    from areal_nb.widgets.views import Dashboard

    rows = [
        {
            "step": 1,
            "reward_mean": 0.5,
            "zero_signal_groups": 0.25,
            "truncated_share": 0.0,
            "reply_len_mean": 7.0,
        },
        {
            "step": 2,
            "reward_mean": 1.0,
            "zero_signal_groups": 0.75,
            "truncated_share": 0.9,
            "reply_len_mean": 16.0,
        },
    ]
    session = SimpleNamespace(history=pd.DataFrame(rows), last_batch=None)
    view = Dashboard(session, live=False)
    html = view.to_html()
    assert html.count('class="anb-signal-warning"') == 1
    assert "75% of the groups had equal rewards" in html and "rollout.group_size" in html
    assert "90% of the replies were cut" in html and "rollout.max_new_tokens" in html
    for column in ("zero_signal_groups", "truncated_share", "reply_len_mean"):
        assert f'data-metric="{column}" data-points="2"' in html
    session.history = pd.DataFrame(rows[:1])  # the latest step has signal: no warning
    assert "anb-signal-warning" not in view.to_html()
    view.close()

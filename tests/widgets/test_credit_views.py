"""Which return each token trains on, in the token and reward views, for leaf and turn credit."""

from __future__ import annotations

import pytest

from areal_nb.rollout.batch import RolloutBatch
from areal_nb.train import GRPOConfig, compute_advantages
from areal_nb.widgets import RewardSource, build_token_view, reward_state, show_rewards, show_tokens
from areal_nb.widgets.render import reward_html, token_view_html

from .conftest import episode


def two_turn_batch(captured, tokenizer, **kwargs):
    """concat_a: first reply reward 0, second reply reward 1; discount 0.9 → turn returns 0.9, 1."""
    return RolloutBatch(
        [episode(captured.concat_a, 0, 0), episode(captured.concat_b, 0, 1)],
        style="concat",
        discount=0.9,
        tokenizer=tokenizer,
        **kwargs,
    )


def test_token_view_bands_show_the_return_each_turn_trains_on(captured, tiny_tokenizer):
    first, second = captured.concat_a.values()
    batch = two_turn_batch(captured, tiny_tokenizer)
    (leaf_row,) = build_token_view(batch, index=0).rows
    (turn_row,) = build_token_view(batch, index=0, credit="turn").rows
    n0, n1 = first.model_response.output_len, second.model_response.output_len
    assert [(b.turn, b.interaction_id, b.n_tokens) for b in turn_row.bands] == [
        (0, first.interaction_id, n0),
        (1, second.interaction_id, n1),
    ]
    assert [b.turn_return for b in turn_row.bands] == pytest.approx([0.9, 1.0])
    assert [b.trained_on for b in turn_row.bands] == pytest.approx([0.9, 1.0])  # own 0 + 0.9 × child 1; own 1
    assert [b.trained_on for b in leaf_row.bands] == [1.0, 1.0]  # the leaf's reward on both turns
    assert (leaf_row.credit, turn_row.credit) == ("leaf", "turn")
    trained = [c.trained_on for c in turn_row.chips if c.loss_mask]
    assert trained == pytest.approx([0.9] * n0 + [1.0] * n1)
    assert all(c.trained_on is None for c in turn_row.chips if not c.loss_mask)
    assert "trains on return 0.9" in next(c for c in turn_row.chips if c.turn == 0).title
    html = token_view_html(build_token_view(batch, index=0, credit="turn"))
    assert (
        'data-credit="turn"' in html and "turn 0 · trains on 0.9" in html and "turn 1 · trains on 1<" in html
    )
    assert html.count('class="anb-turn"') == 2 and "trains on (turn credit)" in html
    leaf_html = token_view_html(build_token_view(batch, index=0))
    assert "turn 0 · trains on 1<" in leaf_html and "credit <b>leaf</b>" in leaf_html


def test_token_view_takes_the_batch_credit_and_discount_and_matches_its_tensors(captured, tiny_tokenizer):
    batch = two_turn_batch(captured, tiny_tokenizer).reexport(credit="turn", discount=0.5)
    view = build_token_view(batch, index=0)
    assert view.credit == "turn"
    assert [b.trained_on for b in view.rows[0].bands] == pytest.approx([0.5, 1.0])
    tensors = batch.to_tensors().tensors()
    row = {k: v[:1] for k, v in tensors.items() if k not in ("group_ids", "episode_ids")}
    from_tensors = build_token_view(row, tokenizer=tiny_tokenizer, credit="turn").rows[0]
    assert [c.trained_on for c in from_tensors.chips] == pytest.approx(
        [c.trained_on for c in view.rows[0].chips]
    )
    assert [(b.turn, b.n_tokens) for b in from_tensors.bands] == [
        (b.turn, b.n_tokens) for b in view.rows[0].bands
    ]
    # individual rows of an hf conversation: one turn each, leaf and turn credit agree
    hf = build_token_view(episode(captured.branching), credit="turn")
    assert all(
        b.trained_on == r.reward or (b.trained_on == 0.0 and r.reward is None)
        for r in hf.rows
        for b in r.bands
    )
    with pytest.raises(ValueError, match="credit must be one of"):
        build_token_view(batch, index=0, credit="leaves")


def test_token_widget_credit_toggle_rerenders(captured, tiny_tokenizer):
    batch = two_turn_batch(captured, tiny_tokenizer)
    view = show_tokens(batch, index=0, live=False)
    assert view.credit_toggle.value == "leaf" and "turn 0 · trains on 1<" in view.body.value
    view.credit_toggle.value = "turn"
    assert view.model.credit == "turn" and "turn 0 · trains on 0.9" in view.body.value
    assert "turn 0 · trains on 0.9" in view._repr_mimebundle_()["text/html"]
    view.close()


def test_reward_view_turn_advantages_equal_the_trainers(captured, tiny_tokenizer):
    batch = two_turn_batch(captured, tiny_tokenizer)
    src = RewardSource.from_any(batch, 0)
    assert src.defaults["credit"] == "leaf"
    tensors = batch.to_tensors().tensors()
    for credit_norm in ("turn", "episode"):
        state = reward_state(src, 0.9, "tree", "concat", credit="turn", credit_norm=credit_norm)
        adv = compute_advantages(tensors, GRPOConfig(credit="turn", credit_norm=credit_norm))["advantages"]
        for i, row in enumerate(state.rows):
            per_token = adv[i][tensors["loss_mask"][i].bool()].tolist()
            shown = [t.advantage for t in row.turns for _ in range(t.n_tokens)]
            assert shown == pytest.approx(per_token, abs=1e-5)
    # concat_a turns return (0.9, 1), concat_b (0.5 + 0.9·0, 0): per turn index ±0.2·√2 and ±0.5·√2
    state = reward_state(src, 0.9, "tree", credit="turn")
    assert [[(t.turn, t.trained_on) for t in r.turns] for r in state.rows] == [
        [(0, pytest.approx(0.9)), (1, 1.0)],
        [(0, 0.5), (1, 0.0)],
    ]
    a = 0.2 / (0.2**2 * 2) ** 0.5  # pool {0.9, 0.5}: ±0.2 / (unbiased std 0.2·√2)
    assert [t.advantage for t in state.rows[0].turns] == pytest.approx([a, 0.5 / 0.5**0.5], abs=1e-4)
    leaf = reward_state(src, 0.9, "tree")
    assert [[t.trained_on for t in r.turns] for r in leaf.rows] == [[1.0, 1.0], [0.0, 0.0]]
    assert all(t.advantage == r.advantage for r in leaf.rows for t in r.turns)
    html = reward_html(state)
    assert 'data-credit="turn"' in html and "normalised per turn index" in html
    assert "turn 0: 0.9 → " in html and html.count('class="anb-row-turn"') == 4


def test_reward_widget_credit_toggle(captured, tiny_tokenizer):
    batch = two_turn_batch(captured, tiny_tokenizer, credit="turn")
    view = show_rewards(batch, index=0, live=False)
    assert view.credit_toggle.value == "turn" and view.state.credit == "turn"
    assert [t.trained_on for t in view.state.rows[0].turns] == pytest.approx([0.9, 1.0])
    view.credit_toggle.value = "leaf"
    assert view.state.credit == "leaf" and [t.trained_on for t in view.state.rows[0].turns] == [1.0, 1.0]
    assert 'data-credit="leaf"' in view.body.value
    view.close()

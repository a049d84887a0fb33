"""Token chips, the individual/concat toggle and the drift check on real captured calls."""

from __future__ import annotations

import math

import pytest

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward, check_retokenization, render_prompt_ids
from areal_nb.widgets import build_token_view
from areal_nb.widgets.render import token_view_html
from areal_nb.widgets.token_model import build_chips, heat_colour, visible_text

from .conftest import episode


def test_concat_row_chips_match_the_exported_row(captured, tiny_tokenizer):
    first, second = captured.concat_a.values()
    view = build_token_view(episode(captured.concat_a))
    assert view.style == "concat" and view.styles_available == ("concat", "individual")
    (row,) = view.rows
    expected = second.token_row()  # the leaf row that concat export trains on
    assert row.interaction_id == second.interaction_id
    assert [c.token_id for c in row.chips] == expected.input_ids
    assert [c.loss_mask for c in row.chips] == expected.loss_mask
    assert [c.turn for c in row.chips] == expected.turn_ids
    assert [c.version for c in row.chips] == expected.versions
    assert [c.logprob for c in row.chips] == pytest.approx(expected.logprobs)
    n_first = first.model_response.output_len
    assert row.n_turns == 2 and row.n_trained == sum(expected.loss_mask)
    assert 0 < row.n_trained and 0 < row.n_masked  # both kinds of chips in a two-turn concat row
    assert sum(c.turn == 0 for c in row.chips) == n_first
    for c in row.chips:
        assert c.text == tiny_tokenizer.decode([c.token_id], skip_special_tokens=False)
        assert (c.heat == "") == (c.loss_mask == 0)
        assert c.special == (c.text in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    im_start = next(c for c in row.chips if c.text == "<|im_start|>")
    assert im_start.special and im_start.visible == "<|im_start|>" and im_start.loss_mask == 0
    newline = next(c for c in row.chips if c.text == "\n")
    assert newline.visible == "↵" and "not trained (loss_mask=0)" in newline.title
    trained = next(c for c in row.chips if c.loss_mask)
    assert f"logprob={trained.logprob:.4f}" in trained.title and "turn=0" in trained.title


def test_individual_rows_one_per_call(captured):
    first, second = captured.concat_a.values()
    view = build_token_view(episode(captured.concat_a), style="individual")
    assert [r.interaction_id for r in view.rows] == [first.interaction_id, second.interaction_id]
    assert [len(r.chips) for r in view.rows] == [len(first.token_row()), len(second.token_row())]
    assert view.rows[0].n_turns == 1 and view.rows[0].n_trained == first.model_response.output_len


def test_hf_conversation_offers_individual_only(captured):
    view = build_token_view(episode(captured.branching))
    assert view.styles_available == ("individual",) and view.style == "individual"
    with pytest.raises(ValueError, match="style 'concat' is not available"):
        build_token_view(episode(captured.branching), style="concat")


def test_drift_check_on_real_concat_row_agrees_with_capture_layer(captured, tiny_tokenizer):
    _, second = captured.concat_a.values()
    (row,) = build_token_view(episode(captured.concat_a)).rows
    check = check_retokenization(second, tiny_tokenizer)
    assert row.drift.matches == check.matches and row.drift.first_difference == check.first_difference
    flagged = [c.position for c in row.chips if c.drift]
    assert flagged == ([] if check.matches else [check.first_difference])


def test_drift_highlights_first_differing_position(tiny_tokenizer):
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    rendered = render_prompt_ids(tiny_tokenizer, messages)
    prompt = list(rendered)
    other = next(t for t in range(3, 50) if t != prompt[4])
    prompt[4] = other  # what the engine saw differs from a plain re-render at position 4
    call = InteractionWithTokenLogpReward(
        model_response=ModelResponse(prompt, [7, 2], [-0.25, -0.5], [1, 1], tokenizer=tiny_tokenizer),
        chat_template_type="concat",
        messages=messages,
        output_message_list=[{"role": "assistant", "content": "5"}],
        _interaction_id="drifted",
    )
    (row,) = build_token_view(call).rows
    d = row.drift
    assert not d.matches and d.first_difference == 4 and d.window_start == 0
    assert d.trained[4] == visible_text(tiny_tokenizer.decode([other]))
    assert d.rendered[4] == visible_text(tiny_tokenizer.decode([rendered[4]]))
    assert [c.position for c in row.chips if c.drift] == [4]
    html = token_view_html(build_token_view(call))
    assert 'data-drift="4"' in html and html.count('anb-drift"') + html.count("anb-drift ") >= 1


def test_tensor_dict_row_and_heat_scale(captured, tiny_tokenizer):
    _, second = captured.concat_a.values()
    td = second.to_tensor_dict()
    view = build_token_view(td, tokenizer=tiny_tokenizer)
    assert [c.loss_mask for c in view.rows[0].chips] == td["loss_mask"][0].tolist()
    assert view.rows[0].reward == 1.0
    assert heat_colour(0.0) == "rgb(255,255,255)" and heat_colour(math.log(0.5)) == "rgb(255,128,128)"
    assert heat_colour(-50.0) == "rgb(255,0,0)"
    assert visible_text(" a\tb\n") == "·a→b↵" and visible_text("") == "∅"
    chips = build_chips(second.token_row(), tiny_tokenizer)
    html = token_view_html(view)
    assert html.count('class="anb-chip anb-loss') == sum(c.loss_mask for c in chips)
    assert html.count('class="anb-chip anb-noloss') == sum(1 - c.loss_mask for c in chips)
    with pytest.raises(ValueError, match="tokenizer"):
        build_token_view(td)

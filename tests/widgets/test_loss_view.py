"""show_loss's view model and static HTML: every value shown is the inspected tensor's."""

from types import SimpleNamespace

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig
from areal_nb.widgets import build_loss_view, show_loss
from areal_nb.widgets.render import loss_view_html
from tests.train.conftest import make_tiny_qwen2
from tests.train.test_actor import make_batch


@pytest.fixture(scope="module")
def inspected():
    """Two inspected updates of a tiny random Qwen2 on the same four rows (rewards 1, 0, 1, 0;
    row 2 made of two turns): `clipped`, where the engine was 0.5 nats surer than the policy so
    r = e^-0.5 < 1 - eps_clip and the negative-advantage rows 1 and 3 are clipped; `capped`, a
    decoupled step where row 0's behaviour weight e^3 exceeds the cap 5."""

    def batch_for(model):
        batch = make_batch(model)
        batch["turn_ids"][2, 6:8] = 2  # row 2: turn 1 = 3 tokens, turn 2 = 2 tokens
        return batch

    plain = Actor(make_tiny_qwen2(), GRPOConfig(recompute_logprob=False, eps_clip=0.2))
    batch = batch_for(plain.model)
    batch["logprobs"] = batch["logprobs"] + 0.5 * batch["loss_mask"]
    plain.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])), inspect=True)

    decoupled = Actor(make_tiny_qwen2(), GRPOConfig(use_decoupled_loss=True, behave_imp_weight_cap=5.0))
    batch = batch_for(decoupled.model)
    batch["logprobs"][0] = batch["logprobs"][0] - 3.0 * batch["loss_mask"][0]
    decoupled.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 0, 0])), inspect=True)
    return SimpleNamespace(clipped=plain.last_inspection, capped=decoupled.last_inspection)


def test_chips_carry_the_inspected_values(inspected, tiny_tokenizer):
    ins = inspected.clipped
    model = build_loss_view(ins, tiny_tokenizer)
    assert len(model.rows) == ins.n_rows == 4
    for row in model.rows:
        i = row.index
        assert row.reward == float(ins.rewards[i])
        assert row.contribution == pytest.approx(float(ins.contribution[i].sum()), abs=1e-7)
        for chip in row.chips:
            p = chip.position
            assert chip.token_id == int(ins.input_ids[i, p]) and chip.trained == bool(ins.loss_mask[i, p])
            assert chip.advantage == pytest.approx(float(ins.advantages[i, p]))
            assert chip.ratio == pytest.approx(float(ins.ratio[i, p]))
            assert chip.clipped == bool(ins.clipped[i, p]) and chip.capped == bool(ins.behave_capped[i, p])
            assert chip.entropy == pytest.approx(float(ins.entropy[i, p]))
            assert chip.contribution == pytest.approx(float(ins.contribution[i, p]))
    two_turns = model.rows[2].turns
    assert [(t.turn, t.n_tokens) for t in two_turns] == [(1, 3), (2, 2)]
    turn_of = ins.turn_ids[2]
    for t in two_turns:
        expected = float(ins.contribution[2][(turn_of == t.turn) & ins.loss_mask[2]].sum())
        assert t.contribution == pytest.approx(expected, abs=1e-7)
    assert model.loss == pytest.approx(float(ins.contribution.sum()), abs=1e-6)


def test_clipped_filter_keeps_the_clipped_rows_and_marks_the_tokens(inspected, tiny_tokenizer):
    ins = inspected.clipped
    model = build_loss_view(ins, tiny_tokenizer, loss_filter="clipped")
    assert [r.index for r in model.rows] == [1, 3]
    for row in model.rows:
        assert [c.selected for c in row.chips] == ins.clipped[row.index, : len(row.chips)].tolist()
    html = loss_view_html(model)
    assert html.count("anb-clipped") == int(ins.clipped.sum()) == row.n_clipped + model.rows[0].n_clipped
    assert "anb-capped" not in html


def test_capped_tokens_are_struck_and_contribute_nothing(inspected, tiny_tokenizer):
    ins = inspected.capped
    model = build_loss_view(
        SimpleNamespace(last_inspection=ins, tokenizer=tiny_tokenizer), loss_filter="capped"
    )
    assert [r.index for r in model.rows] == [0]
    row = model.rows[0]
    assert row.n_capped == int(ins.behave_capped[0].sum()) == 4 and row.contribution == 0.0
    assert loss_view_html(model).count('data-capped="1"') == 4


def test_widget_and_static_html(inspected, tiny_tokenizer):
    view = show_loss(inspected.clipped, tokenizer=tiny_tokenizer, live=False)
    assert view.body.value.count("anb-clipped") == int(inspected.clipped.clipped.sum())
    view.filter_toggle.value = "capped"
    assert "no row has such tokens" in view.body.value
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "anb-loss" in bundle["text/html"]
    view.close()


def test_errors(inspected, tiny_tokenizer):
    with pytest.raises(ValueError, match="inspect=True"):
        build_loss_view(SimpleNamespace(last_inspection=None, tokenizer=tiny_tokenizer))
    with pytest.raises(ValueError, match="tokenizer"):
        build_loss_view(inspected.clipped)
    with pytest.raises(ValueError, match="filter must be one of"):
        build_loss_view(inspected.clipped, tiny_tokenizer, loss_filter="big")


def test_rows_of_several_agents_name_and_colour_their_agent(inspected, tiny_tokenizer):
    """An inspection whose rows the Session labelled with their agents (a multi-agent run): each
    row's head names its agent, with the agents' legend and colours of the other views."""
    from dataclasses import replace

    from areal_nb.widgets.render import agent_colour

    labelled = replace(inspected.clipped, agents=["solver", "checker", "solver", "checker"])
    model = build_loss_view(labelled, tiny_tokenizer)
    assert model.agents == ["solver", "checker"]
    assert [(r.agent, r.agent_index) for r in model.rows] == [("solver", 0), ("checker", 1)] * 2
    html = loss_view_html(model)
    assert 'class="anb-agents" data-agents="2"' in html
    assert html.count('class="anb-row-head" data-agent="checker"') == 2
    assert agent_colour(1) in html and 'agent <b class="anb-row-agent">checker</b>' in html
    # one agent (or none known): no labels
    plain = build_loss_view(inspected.clipped, tiny_tokenizer)
    assert plain.agents == [] and all(r.agent_index is None for r in plain.rows)
    assert "anb-agents" not in loss_view_html(plain)


def test_a_group_whose_advantages_are_all_zero_is_marked_and_a_row_at_its_groups_mean_is_not(tiny_tokenizer):
    import torch

    actor = Actor(make_tiny_qwen2(), GRPOConfig())
    # group 0: rows 0 and 1 scored alike (no signal); group 1: rewards 0, 0.5, 1, so row 3, at the
    # mean, has advantage 0 too, but its group teaches
    batch = make_batch(actor.model, rewards=(1.0, 1.0, 0.0, 0.5))
    batch = {k: torch.cat([v, v[2:3]]) for k, v in batch.items()}
    batch["rewards"][4] = 1.0
    actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 1, 1, 1])), inspect=True)
    ins = actor.last_inspection
    assert ins.groups.tolist() == [0, 0, 1, 1, 1]
    model = build_loss_view(ins, tiny_tokenizer)
    assert [r.zero_signal for r in model.rows] == [
        True,
        True,
        False,
        False,
        False,
    ] and model.n_zero_signal == 2
    html = loss_view_html(model)
    assert html.count('class="anb-zero-signal"') == 2 and "2 of 5 rows in groups without signal" in html
    grey = [c for r in (model.rows[0], model.rows[1], model.rows[3]) for c in r.chips if c.trained]
    assert grey and all(abs(c.advantage) <= 1e-6 for c in grey)
    assert html.count("background:#e4e4e4;color:#000") == len(grey)  # grey chips: no push either way
    assert torch.all(ins.advantages[[2, 4]][ins.loss_mask[[2, 4]].bool()] != 0)

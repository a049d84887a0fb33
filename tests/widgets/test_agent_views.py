"""The views of a multi-agent episode name and colour each agent: the tree labels and marks
every call with its agent, the token view shows one conversation per agent, and the reward view's
advantages are normalised per agent, as the trainer's are. A single agent shows none of it."""

from __future__ import annotations

import pytest

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import Episode
from areal_nb.widgets import render
from areal_nb.widgets.reward_model import RewardSource, reward_state
from areal_nb.widgets.token_model import build_token_view
from areal_nb.widgets.tree_model import build_tree

EOS = 1


def call(iid, agent, reward, prompt):
    return InteractionWithTokenLogpReward(
        model_response=ModelResponse(
            input_tokens=prompt,
            output_tokens=[7, 8, EOS],
            output_logprobs=[-0.5] * 3,
            output_versions=[0] * 3,
            stop_reason="stop",
            eos_token_ids=[EOS],
        ),
        reward=reward,
        messages=[{"role": "user", "content": f"{agent} prompt"}],
        output_message_list=[{"role": "assistant", "content": iid}],
        agent=agent,
        _interaction_id=iid,
    )


def episode(sample, solver, checker, agents=("solver", "checker")):
    calls = [
        call(f"s{sample}-{agents[0]}", agents[0], solver, [2, 3]),
        call(f"s{sample}-{agents[1]}-2", agents[1], checker, [4, 5, 6]),
    ]
    return Episode(
        data={},
        group_id=0,
        sample_id=sample,
        version_submitted=0,
        interactions={c.interaction_id: c for c in calls},
    )


def test_the_tree_names_and_colours_each_agent():
    tree = build_tree(episode(0, 1.0, 0.0))
    assert tree.agents == ["solver", "checker"] and tree.multi_agent
    assert [(n.label, n.agent_index) for n in tree.nodes] == [("solver · turn 0", 0), ("checker · turn 0", 1)]
    html = render.tree_svg(tree)
    assert 'class="anb-agents" data-agents="2"' in html
    assert html.count('class="anb-agent-bar"') == 2
    assert 'data-agent="solver"' in html and 'data-agent="checker"' in html
    assert render.agent_colour(0) in html and render.agent_colour(1) in html


def test_the_token_view_shows_one_conversation_per_agent(tiny_tokenizer):
    view = build_token_view(episode(0, 1.0, 0.0), tokenizer=tiny_tokenizer)
    assert view.agents == ["solver", "checker"]
    assert [(r.agent, r.interaction_id) for r in view.rows] == [
        ("solver", "s0-solver"),
        ("checker", "s0-checker-2"),
    ]
    html = render.token_view_html(view)
    assert html.count('class="anb-row-agent"') == 2
    assert '<div class="anb-row" data-style="individual" data-agent="checker"' in html


def test_the_reward_view_normalises_each_agents_rows_among_themselves():
    batch = RolloutBatch([episode(0, 1.0, 1.0), episode(1, 0.0, 1.0)])
    state = reward_state(RewardSource.from_any(batch, 0), gamma=1.0)
    by_row = {r.interaction_id: r.advantage for r in state.rows}
    # solver [1, 0] → ±0.7071; checker [1, 1] → 0 (pooled with the solver it would be ±0.577 / +0.577)
    assert by_row["s0-solver"] == pytest.approx(0.70710, abs=1e-4)
    assert by_row["s1-solver"] == pytest.approx(-0.70710, abs=1e-4)
    assert by_row["s0-checker-2"] == by_row["s1-checker-2"] == 0.0
    assert "solver: s0-solver" in render.reward_html(state)


def test_one_agent_shows_no_agent_marks(tiny_tokenizer):
    one = episode(0, 1.0, 0.0, agents=("default", "default"))
    tree = build_tree(one)
    assert not tree.multi_agent and [n.label for n in tree.nodes] == ["turn 0", "turn 0"]
    html = render.tree_svg(tree) + render.token_view_html(build_token_view(one, tokenizer=tiny_tokenizer))
    assert "anb-agent" not in html and "data-agent" not in html

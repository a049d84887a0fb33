"""The tool task end to end: `configs/tool_use.yaml` on the built-in `tiny-tools` model.

Real Session: the embedded engine, the real proxy, the ToolAgent's OpenAI SDK calls, the model's
own `<tool_call>` text parsed into `tool_calls`. Two training steps, then a greedy evaluation; the
conversation trees must show the tool turns. (The learning run itself, `make demo-tools`, is
measured in benchmarks/RESULTS.md, not here.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_nb import Session
from areal_nb.agents.tool_agent import ToolAgent
from areal_nb.config import load_config
from areal_nb.data import tool_task
from areal_nb.data.tool_task import answer_reward, calculator
from areal_nb.widgets.tree_model import build_tree

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tool_use.yaml"
SMALL = [
    "rollout.batch_size=4",
    "rollout.group_size=2",
    "data.eval_size=8",
    "logging.eval_every=0",
    "logging.progress=false",
]


def tool_episodes(batch) -> list[tuple]:
    """(call, answer) pairs of the episodes whose first turn called the calculator."""
    pairs = []
    for i, ep in enumerate(batch.episodes):
        calls = batch.calls(i)
        if ep.accepted and len(calls) == 2 and calls[0].output_message_list[0].get("tool_calls"):
            pairs.append((calls[0], calls[1]))
    return pairs


def test_the_splits_share_no_factor_pair():
    train, test = tool_task.train_rows(), tool_task.test_rows()
    assert len(train) == 4096 and len(test) == 200
    pairs = {frozenset(r["expression"].split("*")) for r in test}
    assert not any(frozenset(r["expression"].split("*")) in pairs for r in train)


def test_the_model_folder_loads_the_tokenizer_it_was_trained_with():
    from areal_nb.models import load_tokenizer, resolve_model_path

    by_name, by_folder = load_tokenizer("tiny-tools"), load_tokenizer(resolve_model_path("tiny-tools"))
    text = by_name.apply_chat_template(
        tool_task.test_rows()[0]["messages"],
        tools=[tool_task.CALCULATOR_TOOL],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert by_folder.encode(text) == by_name.encode(text) and len(by_name.encode(text)) <= 40


def test_the_tool_task_trains_and_the_tree_shows_the_tool_turns():
    cfg = load_config(CONFIG, SMALL)
    with Session(cfg) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        batch = s.last_batch
        pairs = tool_episodes(batch)
        assert pairs, "no episode of the last batch called the tool"
        for call, answer in pairs:
            # turn 2 is the child of the call and got the calculator's result as a tool message
            tool_call = call.output_message_list[0]["tool_calls"][0]
            assert answer.parent is call and tool_call["function"]["name"] == "calculator"
            tool_message = answer.messages[-1]
            assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == tool_call["id"]
            expected = ToolAgent().call_tool("calculator", tool_call["function"]["arguments"])
            assert tool_message["content"] == expected
            if not expected.startswith("error"):  # the model's own expression, evaluated
                assert expected == calculator(json.loads(tool_call["function"]["arguments"])["expression"])
        # the tree: the call's node shows the tool call, its child node the tool result turn
        tree = build_tree(batch)
        by_id = {n.id: n for n in tree.nodes}
        tool_nodes = [n for n in tree.nodes if "tool" in n.roles.split(",")]  # the turn a tool result opened
        assert len(tool_nodes) == len(pairs)
        for node in tool_nodes:
            parent = by_id[node.parent_id]
            assert parent.depth == 0 and node.depth == 1 and "[tool call calculator(" in parent.reply
            assert node.reward_raw in (0.0, 1.0) and parent.reward_raw == 0.0  # the answer is scored
        # the interactions table has both turns of those episodes
        df = batch.interactions_df
        assert set(df["turn"]) >= {0, 1}

        # greedy evaluation on the held-out rows: success is the share of episodes whose answer scored
        result = s.evaluate()
        assert result.n == 8 and result.rejected == 0 and s.eval_problems == tool_task.test_rows()[:8]
        returns = [result.batch.episode_return(i) for i in range(8)]
        assert set(returns) <= {0.0, 1.0} and result.agent_accuracy == sum(returns) / 8
        for i in range(8):  # the reward is answer_reward of the episode's row and its final answer
            final = result.batch.calls(i)[-1].output_message_list[0]
            row = next(r for r in s.eval_problems if r["messages"] == result.batch.calls(i)[0].messages)
            assert returns[i] == (
                0.0 if final.get("tool_calls") else answer_reward(row, final.get("content") or "")
            )

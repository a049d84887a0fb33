"""Writes the browser test's notebook: a tiny Session, its batch's three views, the dashboard, a step."""

from __future__ import annotations

from pathlib import Path

import nbformat

SETUP = '''\
import os
from openai import AsyncOpenAI
from areal_nb import Session

class TwoTurnAgent:
    """Always two turns (answer, then the correction prompt) so every concat row has two turns."""

    async def run(self, data, **kw):
        client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"),
                             max_retries=0)
        messages, rewards = list(data["messages"]), {}
        for turn in range(2):
            c = await client.chat.completions.create(model="default", messages=messages, max_completion_tokens=6)
            msg = c.choices[0].message
            # reward the last turn so that a discount changes the first turn's reward
            rewards[c.id] = 1.0 if turn == 1 else 0.0
            messages = messages + [msg.model_dump(exclude_none=True), {"role": "user", "content": "Check it."}]
        return rewards

from areal_nb.config import load_config

config = load_config({"agent": {"workflow_kwargs": {}, "chat_template_type": "concat", "export_style": "concat",
                                "turn_discount": 1.0},
                      "rollout": {"batch_size": 1, "group_size": 2, "max_new_tokens": 6, "max_concurrent_rollouts": 4},
                      "data": {"eval_size": 2}, "logging": {"eval_every": 0}})
config.agent.workflow = TwoTurnAgent()  # an agent instance (not serialisable, so set after loading)
session = Session(config)
batch = session.rollout()
print("episodes", len(batch.episodes), [e.rejection_reason for e in batch.episodes])'''

# An off-policy copy of the batch (rewards 1 and 0; the engine 0.5 nats surer than the policy):
# r = e^-0.5 < 1 - eps_clip, so the negative-advantage row is clipped. A copy of the policy
# trains on it, so the session's own step (and the dashboard) are unaffected.
LOSS_CELL = """\
import copy, dataclasses, torch
from areal_nb.train import Actor, TrainBatch
from areal_nb.widgets import show_loss
t = batch.to_tensors().tensors()
t["rewards"] = torch.tensor([1.0, 0.0])
t["logprobs"] = t["logprobs"] + 0.5 * t["loss_mask"]
cfg = dataclasses.replace(session.actor.cfg, use_decoupled_loss=False, recompute_logprob=False, eps_clip=0.2)
probe = Actor(copy.deepcopy(session.actor.model), cfg)
probe.train_step(TrainBatch(**t), inspect=True)
print("clipped tokens", int(probe.last_inspection.clipped.sum()))
loss_view = show_loss(probe.last_inspection, tokenizer=session.tokenizer)
loss_view"""

# The lab: the same off-policy copy under three variants (no step); PPO's clip acts where the
# engine's record is 0.5 nats off, CISPO's weight does not clip there, so the lanes disagree.
COMPARE_CELL = """\
cmp = session.compare(TrainBatch(**t), {"grpo": {"use_decoupled_loss": False, "recompute_logprob": False, "eps_clip": 0.2},
                          "cispo": {"use_decoupled_loss": False, "recompute_logprob": False},
                          "dr_grpo": {}})
compare_view = cmp.view(row=1)  # the negative-advantage row, where PPO clips
print("lab lanes", len(cmp.variants), "disagree", compare_view.model.n_disagree)
compare_view"""

CELLS = [
    SETUP,
    "tree = batch.show_tree(0)\ntree",
    # the proxy's responses carry no tokenizer, so the view is given the session's
    "from areal_nb.widgets import show_tokens\ntokens = show_tokens(batch.episodes[0], tokenizer=session.tokenizer)\ntokens",
    "rewards = batch.show_rewards(0)\nrewards",
    LOSS_CELL,
    COMPARE_CELL,
    "dash = session.dashboard()\ndash",
    "stats = session.train_step(batch)\nprint('trained step', stats['step'])",
]


def write_notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path

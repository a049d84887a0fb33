"""A reward is discounted exactly once between the agent and the trainer.

The Session's path: its workflow (as `session/builder.py` builds it) exports the calls as the agent
rewarded them, the `RolloutBatch` discounts and styles them, and `Actor.train_step` turns the rows'
rewards into advantages. A three-turn chain with rewards 1, 2, 3 and γ = 0.9 (tree rule) gives
the rows 1 + 0.9·4.7 = 5.23, 2 + 0.9·3 = 4.7 and 3; a second discount of those values would give
11.89, 7.4 and 3.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from areal_nb.config import load_config
from areal_nb.proxy import ProxySettings, create_app
from areal_nb.rollout import RolloutBatch
from areal_nb.rollout.executor import Episode
from areal_nb.session import builder
from areal_nb.testing import ScriptedEngine
from areal_nb.train import Actor, GRPOConfig

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
ADMIN_KEY = "discount-once-admin-key"
UNREACHABLE = "http://proxy.invalid:9"  # in-process: nothing goes over the network
QUESTION = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def run_episode(workflow, data):
    async def main():
        try:
            return await workflow.arun_episode(None, data)
        finally:
            await workflow.aclose()

    return asyncio.run(main())


# the rows' rewards: the tree rule once (a second discount would give 11.89, 7.4, 3)
EXPECTED = torch.tensor([1 + 0.9 * (2 + 0.9 * 3), 2 + 0.9 * 3, 3.0])


def session_batch(tiny_tokenizer) -> tuple[dict, RolloutBatch]:
    """One episode of a three-turn agent through the Session's workflow, and its RolloutBatch."""
    cfg = load_config(
        CONFIG,
        {
            # tests.proxy.agents.ChatAgent rewards turn i with i + 1 (a dict reward)
            "agent.workflow": "tests.proxy.agents.ChatAgent",
            "agent.workflow_kwargs": {"turns": 3},
            "agent.mode": "inline",
            "agent.turn_discount": 0.9,
            "agent.discount_mode": "tree",
            "agent.export_style": "individual",
        },
    )
    app = create_app(
        ScriptedEngine(tiny_tokenizer, "The answer is 4"),
        tiny_tokenizer,
        ProxySettings(admin_api_key=ADMIN_KEY),
    )
    proxy = builder.Proxy(app=app, server=SimpleNamespace(url=UNREACHABLE), admin_key=ADMIN_KEY)
    interactions = run_episode(builder.build_workflow(cfg, proxy), QUESTION)
    assert interactions is not None and len(interactions) == 3
    agent = cfg.agent
    batch = RolloutBatch(  # as Session._batch builds it
        [Episode(QUESTION, group_id=0, sample_id=0, version_submitted=0, interactions=interactions)],
        style=agent.export_style,
        discount=agent.turn_discount,
        discount_mode=agent.discount_mode,
        credit="leaf",
    )
    return interactions, batch


def test_the_session_workflow_exports_raw_rewards_and_the_batch_discounts_them_once(tiny_tokenizer):
    interactions, batch = session_batch(tiny_tokenizer)
    # the export the Session trains on: the rewards as the agent set them, not yet discounted
    assert [it.reward for it in interactions.values()] == [1.0, 2.0, 3.0]
    assert [it.raw_reward for it in interactions.values()] == [1.0, 2.0, 3.0]
    torch.testing.assert_close(batch.to_tensors().rewards, EXPECTED)


@pytest.mark.slow
def test_three_turn_rewards_reach_the_trainer_discounted_once(tiny_tokenizer, tiny_model_path):
    from transformers import AutoModelForCausalLM

    _, batch = session_batch(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    actor = Actor(model, GRPOConfig(lr=1e-4))
    actor.train_step(batch.to_tensors(), credit=batch.credit, inspect=True)
    seen = actor.last_inspection
    torch.testing.assert_close(seen.rewards, EXPECTED)
    # GRPO: one group of three rows, (r - mean) / (unbiased std + 1e-5) on every generated token
    advantages = [0.78967, 0.33475, -1.12442]
    mask = seen.loss_mask.bool()
    for row in range(3):
        assert mask[row].sum() > 0
        torch.testing.assert_close(
            seen.advantages[row][mask[row]],
            torch.full((int(mask[row].sum()),), advantages[row]),
            atol=1e-4,
            rtol=0,
        )

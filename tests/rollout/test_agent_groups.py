"""Several agents in one episode: a batch's groups are (prompt, agent) pairs, so each agent's
advantages are normalised against the same agent's rows of the same prompt only.

A fixed batch (a solver and a checker call per episode, rewards chosen here) goes through
`RolloutBatch.to_tensors` and the trainer's `compute_advantages`; the advantages equal the
numbers worked out by hand below."""

from __future__ import annotations

import math

import pytest
import torch

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import Episode
from areal_nb.train.advantages import compute_advantages
from areal_nb.train.config import GRPOConfig

EOS = 1
EPS = 1e-5


def call(iid: str, agent: str, reward: float, n_out: int) -> InteractionWithTokenLogpReward:
    return InteractionWithTokenLogpReward(
        model_response=ModelResponse(
            input_tokens=[2, 3, 4],
            output_tokens=[7] * n_out + [EOS],
            output_logprobs=[-0.5] * (n_out + 1),
            output_versions=[0] * (n_out + 1),
            stop_reason="stop",
            eos_token_ids=[EOS],
        ),
        reward=reward,
        messages=[{"role": "user", "content": f"{agent} prompt"}],
        output_message_list=[{"role": "assistant", "content": iid}],
        agent=agent,
        _interaction_id=iid,
    )


def episode(group: int, sample: int, solver: float, checker: float) -> Episode:
    name = f"g{group}s{sample}"
    calls = {
        f"{name}-solver": call(f"{name}-solver", "solver", solver, 1 + sample),
        f"{name}-checker": call(f"{name}-checker", "checker", checker, 2),
    }
    return Episode(data={}, group_id=group, sample_id=sample, version_submitted=0, interactions=calls)


# prompt 0: three samples; prompt 1: two. (solver reward, checker reward) per episode.
REWARDS = {0: [(1.0, 1.0), (0.0, 1.0), (0.0, 0.0)], 1: [(1.0, 0.0), (1.0, 1.0)]}


@pytest.fixture
def batch() -> RolloutBatch:
    return RolloutBatch([episode(g, s, *r) for g, pairs in REWARDS.items() for s, r in enumerate(pairs)])


def test_rows_carry_their_agent_and_the_groups_are_prompt_agent_pairs(batch):
    t = batch.to_tensors().tensors()
    assert batch.agents == ["solver", "checker"]
    # rows in episode order, each episode's solver call first
    assert t["agent_ids"].tolist() == [0, 1] * 5
    assert t["group_ids"].tolist() == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3]  # group · 2 + agent
    assert t["episode_ids"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert batch.interactions_df["agent"].tolist() == ["solver", "checker"] * 5


def test_grpo_advantages_per_prompt_and_agent_equal_the_hand_computation(batch):
    t = batch.to_tensors().tensors()
    out = compute_advantages(t, GRPOConfig())
    # By hand: GRPO's A = (r − mean) / (std + eps), std unbiased, over one agent's rows of one prompt.
    # prompt 0 solver  [1, 0, 0]: mean 1/3, std √(((2/3)² + 2·(1/3)²) / 2) = √(1/3)
    # prompt 0 checker [1, 1, 0]: mean 2/3, std √(1/3)
    # prompt 1 solver  [1, 1]:    std 0 → A = 0 / (0 + eps) = 0
    # prompt 1 checker [0, 1]:    mean 1/2, std √(1/2)
    s3, s2 = math.sqrt(1 / 3), math.sqrt(1 / 2)
    solver = [(2 / 3) / (s3 + EPS), (-1 / 3) / (s3 + EPS), (-1 / 3) / (s3 + EPS), 0.0, 0.0]
    checker = [
        (1 / 3) / (s3 + EPS),
        (1 / 3) / (s3 + EPS),
        (-2 / 3) / (s3 + EPS),
        -0.5 / (s2 + EPS),
        0.5 / (s2 + EPS),
    ]
    want = [a for pair in zip(solver, checker, strict=True) for a in pair]
    assert out["scores"].tolist() == pytest.approx(want, abs=1e-6)
    # every generated token of a row trains on its row's advantage, prompt tokens on nothing
    mask = t["loss_mask"].bool()
    for b, a in enumerate(want):
        assert out["advantages"][b][mask[b]].tolist() == pytest.approx([a] * int(mask[b].sum()), abs=1e-6)
        assert out["advantages"][b][~mask[b]].abs().sum() == 0
    # the prompt alone as the group would mix the agents: prompt 0's solver rows would be judged
    # against a mean of 1/2 over six rewards, not 1/3
    mixed = compute_advantages(t, GRPOConfig(), group_ids=batch.to_tensors().episode_ids // 3)
    assert not torch.allclose(mixed["scores"], out["scores"])


def test_rloo_leaves_out_only_the_same_agents_rows(batch):
    out = compute_advantages(batch.to_tensors(), GRPOConfig(adv_estimator="rloo"))
    # By hand: A_i = r_i − mean of the other rows of the same prompt and agent.
    solver = [1 - 0.0, 0 - 0.5, 0 - 0.5, 1 - 1.0, 1 - 1.0]
    checker = [1 - 0.5, 1 - 0.5, 0 - 1.0, 0 - 1.0, 1 - 0.0]
    want = [a for pair in zip(solver, checker, strict=True) for a in pair]
    assert out["scores"].tolist() == pytest.approx(want, abs=1e-6)


def test_per_agent_reward_means(batch):
    assert batch.agent_reward_means() == pytest.approx({"solver": 3 / 5, "checker": 3 / 5})
    assert batch.agent_returns(1) == {"solver": 0.0, "checker": 1.0}


def test_one_agent_keeps_the_episode_groups():
    single = RolloutBatch([episode(g, s, 1.0, 0.0) for g in (0, 1) for s in (0, 1)])
    for ep in single.episodes:  # the checker calls removed: one agent
        ep.interactions = {k: v for k, v in ep.interactions.items() if v.agent == "solver"}
    t = single.to_tensors().tensors()
    assert t["group_ids"].tolist() == [0, 0, 1, 1] and t["agent_ids"].tolist() == [0, 0, 0, 0]


def test_dynamic_sampling_keeps_a_prompt_where_some_agents_rewards_differ():
    from areal_nb.session.dynamic_sampling import informative_episodes

    # prompt 0: the episodes' returns tie (1 + 0 = 0 + 1) but each agent's differ: kept.
    # prompt 1: each agent scored the same in both episodes: nothing to learn, dropped.
    batch = RolloutBatch(
        [episode(0, 0, 1.0, 0.0), episode(0, 1, 0.0, 1.0), episode(1, 0, 1.0, 0.0), episode(1, 1, 1.0, 0.0)]
    )
    kept, dropped = informative_episodes(batch)
    assert [ep.group_id for ep in kept] == [0, 0] and dropped == 1

"""`AgentRewards`: an episode's reward per agent, for episodes in which several agents take part.

An agent's `run` may return one number (the episode's reward: set on the most recently completed
call), `{interaction_id: reward}` (each named call's), or `AgentRewards({agent: reward})`: each
agent's reward set on that agent's most recently completed call, from where the discount carries
it back through that agent's own turns. An agent is the `model` name its calls sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AgentRewards:
    # agent name (the `model` its calls sent) → that agent's episode reward
    per_agent: dict[str, float]

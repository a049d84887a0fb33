"""A chat agent for any task: your rows, your reward function, plain OpenAI SDK code.

Each row gives the prompt — its "messages" (a chat list) or its "prompt" (one user message) —
and `reward_fn(row, reply_text)` scores every reply (sync or async, see
`areal_nb.reward.functions`). With `max_turns > 1` a reply scored <= 0 gets `retry_prompt` and
another try, like the math agent's correction turn. The function runs here, in the agent, so a
function defined in a notebook cell works (inline mode; in subproc mode it must be importable).

    Session(config, dataset=rows, agent__workflow=ChatAgent(reward_fn=my_reward))
    # YAML:  agent: {workflow: areal_nb.agents.chat_agent.ChatAgent,
    #                workflow_kwargs: {reward_fn: my_pkg.rewards.exact_match}}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from areal_nb.reward import RewardFn, compute_reward, resolve_reward

RETRY_PROMPT = "That is not right. Try again."


def prompt_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a row asks for: its "messages", or its "prompt" as one user message."""
    if "messages" in row:
        return list(row["messages"])
    if "prompt" in row:
        return [{"role": "user", "content": str(row["prompt"])}]
    raise KeyError(f"the row has neither 'messages' nor 'prompt' (its keys: {sorted(row)})")


class ChatAgent:
    def __init__(
        self,
        reward_fn: RewardFn | str,
        max_turns: int = 1,
        retry_prompt: str = RETRY_PROMPT,
        model: str = "default",
        temperature: float | None = None,  # None: the server's default (rollout.temperature; greedy in evaluate())
        max_completion_tokens: int | None = None,  # None: rollout.max_new_tokens
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.reward_fn = resolve_reward(reward_fn)
        self.max_turns = max_turns
        self.retry_prompt = retry_prompt
        self.model = model
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
            api_key=extra_kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        sampling = {k: v for k, v in (("temperature", self.temperature),
                                      ("max_completion_tokens", self.max_completion_tokens)) if v is not None}
        messages = prompt_messages(data)
        rewards: dict[str, float] = {}
        for _ in range(self.max_turns):
            completion = await client.chat.completions.create(model=self.model, messages=messages, **sampling)
            message = completion.choices[0].message
            reward = await compute_reward(self.reward_fn, data, message.content or "")
            rewards[completion.id] = reward
            if reward > 0:
                break
            # Echo the assistant message exactly as returned so the proxy links the next turn to it.
            messages = messages + [message.model_dump(exclude_none=True), {"role": "user", "content": self.retry_prompt}]
        return rewards

"""A chat agent for any task: your rows, your reward function, plain OpenAI SDK code.

Each row gives the prompt — its "messages" (a chat list) or its "prompt" (one user message) —
and `reward_fn(row, reply_text)` scores every reply (sync or async, see
`areal_nb.reward.functions`). With `max_turns > 1` a reply scored <= 0 gets `retry_prompt` and
another try, like the math agent's correction turn. The function runs here, in the agent, so a
function defined in a notebook cell works in both modes (a `subproc` agent travels to its worker
by value, the function with it).

    Session(config, dataset=rows, agent__workflow=ChatAgent(reward_fn=my_reward))
    # YAML:  agent: {workflow: areal_nb.agents.chat_agent.ChatAgent,
    #                workflow_kwargs: {reward_fn: my_pkg.rewards.exact_match}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal_nb.errors import ArgumentTypeError
from areal_nb.reward import RewardFn, compute_reward, resolve_reward

from .sdk_agent import SDKAgent, openai_client

_RETRY_PROMPT = "That is not right. Try again."


def prompt_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a row asks for: its "messages", or its "prompt" as one user message.

    A None value counts as absent: a table mixing both kinds of row has an empty cell (None) in
    the column a row does not use."""
    if row.get("messages") is not None:
        messages = row["messages"]
        if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
            raise ArgumentTypeError(
                f"the row's 'messages' must be a list of chat messages, got {type(messages).__name__}"
            )
        return list(messages)
    if row.get("prompt") is not None:
        return [{"role": "user", "content": str(row["prompt"])}]
    raise KeyError(f"the row has neither 'messages' nor 'prompt' (its keys: {sorted(map(str, row))})")


class ChatAgent(SDKAgent):
    def __init__(
        self,
        reward_fn: RewardFn | str,
        max_turns: int = 1,
        retry_prompt: str = _RETRY_PROMPT,
        model: str = "default",
        temperature: float
        | None = None,  # None: the server's default (rollout.temperature; greedy in evaluate())
        max_completion_tokens: int | None = None,  # None: rollout.max_new_tokens
    ) -> None:
        super().__init__(max_turns, model, temperature, max_completion_tokens)
        self.reward_fn = resolve_reward(reward_fn)
        self.retry_prompt = retry_prompt

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        """Each reply's reward by completion id."""

        async def score(reply: str) -> float:
            return await compute_reward(self.reward_fn, data, reply)

        return await self.answer_until_rewarded(
            openai_client(**extra_kwargs), prompt_messages(data), score, self.retry_prompt
        )

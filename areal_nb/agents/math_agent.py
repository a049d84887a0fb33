"""The seed's multi-turn math agent as a proxy agent: answer, check, and retry once corrected.

Plain OpenAI SDK code: nothing here knows about tokens, log-probs or the trainer. Each turn's
completion gets its own reward (1.0 correct, 0.0 wrong); the episode stops at the first
correct answer or after `max_turns`. Sampling (temperature, token budget) is left to the server
unless given here: behind a Session's proxy that is the config's `rollout.temperature`,
`rollout.top_p` and `rollout.max_new_tokens`, and greedy during `evaluate()`.
"""

from __future__ import annotations

import os
from typing import Any

from areal_nb.data import CORRECTION_PROMPT
from areal_nb.reward import AsyncRewardWrapper, math_reward


class MultiTurnMathAgent:
    def __init__(
        self,
        max_turns: int = 2,
        model: str = "default",
        temperature: float | None = None,  # None: the server's default
        max_completion_tokens: int | None = None,
        reward_timeout: float = 15.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.model = model
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens
        self.reward_timeout = reward_timeout
        self._reward: AsyncRewardWrapper | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The reward wrapper owns worker processes; a pickled copy (subproc mode) makes its own.
        state = dict(self.__dict__)
        state["_reward"] = None
        return state

    def close(self) -> None:
        """Stop the reward worker processes (the Session calls this on close); the next `run`
        starts new ones, so a closed agent can still be used."""
        reward, self._reward = self._reward, None
        if reward is not None:
            reward.close()

    def _reward_fn(self) -> AsyncRewardWrapper:
        if self._reward is None:
            self._reward = AsyncRewardWrapper(math_reward, timeout_seconds=self.reward_timeout)
        return self._reward

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
        messages = list(data["messages"])
        rewards: dict[str, float] = {}
        for _ in range(self.max_turns):
            completion = await client.chat.completions.create(model=self.model, messages=messages, **sampling)
            message = completion.choices[0].message
            reward = await self._reward_fn()(message.content or "", data["answer"])
            rewards[completion.id] = reward
            if reward > 0:
                break
            # Echo the assistant message exactly as returned so the proxy links the next turn to it.
            messages = messages + [message.model_dump(exclude_none=True), {"role": "user", "content": CORRECTION_PROMPT}]
        return rewards

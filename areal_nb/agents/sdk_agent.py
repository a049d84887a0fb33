"""What the built-in agents share: the episode's OpenAI client and the answer-score-retry loop.

Plain OpenAI SDK code, nothing areal_nb-specific: `run(data, base_url, api_key, http_client)` is
what any agent receives (in subproc mode the same arrive as OPENAI_BASE_URL / OPENAI_API_KEY).
An agent of your own needs none of this; the built-in ones use it so the loop is written once.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from areal_nb.errors import InvalidArgumentError

Messages = list[dict[str, Any]]


def openai_client(
    base_url: str | None = None, api_key: str | None = None, http_client: Any = None, **_more: Any
):
    """The episode's `AsyncOpenAI` client: the given endpoint, key and HTTP client, else the env's.

    A new client per episode is cheap when `http_client` is given (the Session always gives one,
    and the SDK client is then a thin wrapper around it): ~0.09 ms CPU to build, ~0.05 ms more than
    reusing one client with `with_options(api_key=...)` (benchmarks/grpo_step.py, multi-turn
    episodes of ~2.4 s), so the agents stay plain. Its first request also looks up the platform in a
    worker thread (once per client, the SDK's own step): ~0.1 ms more of the event loop's CPU per
    episode, 7 % of the loop's CPU in a single-turn step (one run, load 7). `max_retries=0`: a
    retried call would be a second, unlinked generation in the episode.
    """
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
        api_key=api_key or os.environ.get("OPENAI_API_KEY"),
        http_client=http_client,
        max_retries=0,
    )


def echo(message: Any) -> dict[str, Any]:
    """The assistant message exactly as returned, to send back: the proxy links the next turn to it."""
    return message.model_dump(exclude_none=True)


class SDKAgent:
    """Sampling settings, one chat call, and the retry loop of the math and chat agents.

    `temperature` / `max_completion_tokens` None: the server's default (behind a Session's proxy:
    the config's `rollout.*`, greedy during `evaluate()`).
    """

    def __init__(
        self,
        max_turns: int,
        model: str = "default",
        temperature: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> None:
        if max_turns < 1:
            raise InvalidArgumentError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.model = model
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens

    async def chat(self, client: Any, messages: Messages, model: str | None = None, **kwargs: Any):
        """One `chat.completions.create` with this agent's sampling, as `model` (default: the
        agent's own; the proxy tags the call with the name, so several agents can share a client)."""
        sampling = {
            k: v
            for k, v in (
                ("temperature", self.temperature),
                ("max_completion_tokens", self.max_completion_tokens),
            )
            if v is not None
        }
        return await client.chat.completions.create(
            model=model or self.model, messages=messages, **sampling, **kwargs
        )

    async def answer_until_rewarded(
        self, client: Any, messages: Messages, score: Callable[[str], Awaitable[float]], retry_prompt: str
    ) -> dict[str, float]:
        """Ask, score the reply; a reply scored <= 0 gets `retry_prompt` and another try, up to
        `max_turns`. Returns each completion's reward by completion id."""
        rewards: dict[str, float] = {}
        for _ in range(self.max_turns):
            completion = await self.chat(client, messages)
            message = completion.choices[0].message
            rewards[completion.id] = reward = await score(message.content or "")
            if reward > 0:
                break
            messages = messages + [echo(message), {"role": "user", "content": retry_prompt}]
        return rewards

"""A tool-using agent in plain OpenAI SDK code: offer tools, run the calls the model makes, answer.

Each turn sends the conversation with `tools=[...]`; when the reply holds `tool_calls`, the agent
runs each named Python function on the JSON arguments and appends the results as `role: "tool"`
messages, then asks again; a reply without tool calls is the answer, scored by
`reward_fn(row, answer_text)`. The reward goes to that last call; the proxy discounts it back
over the tool-call turns (`agent.turn_discount`), and the conversation tree shows every turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from areal_nb.data.tool_task import CALCULATOR_TOOL, calculator
from areal_nb.reward import RewardFn, compute_reward, resolve_reward

DEFAULT_TOOLS: dict[str, tuple[dict, Callable[..., str]]] = {"calculator": (CALCULATOR_TOOL, calculator)}


class ToolAgent:
    def __init__(
        self,
        reward_fn: RewardFn | str = "areal_nb.data.tool_task.answer_reward",
        max_turns: int = 3,
        model: str = "default",
        temperature: float | None = None,  # None: the server's default
        max_completion_tokens: int | None = None,
        tools: dict[str, tuple[dict, Callable[..., str]]] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.reward_fn = resolve_reward(reward_fn)
        self.max_turns = max_turns
        self.model = model
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens
        self.tools = dict(DEFAULT_TOOLS if tools is None else tools)

    def call_tool(self, name: str, arguments: str) -> str:
        """The tool's result as text; unknown tools and bad arguments are reported to the model."""
        if name not in self.tools:
            return f"error: no tool named {name!r}"
        try:
            args = json.loads(arguments or "{}")
            return str(self.tools[name][1](**args))
        except (json.JSONDecodeError, TypeError) as e:
            return f"error: bad arguments for {name} ({e})"

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
            api_key=extra_kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        sampling = {k: v for k, v in (("temperature", self.temperature),
                                      ("max_completion_tokens", self.max_completion_tokens)) if v is not None}
        schemas = [schema for schema, _ in self.tools.values()]
        messages = list(data["messages"])
        answer = ""
        for _ in range(self.max_turns):
            completion = await client.chat.completions.create(model=self.model, messages=messages, tools=schemas,
                                                              **sampling)
            message = completion.choices[0].message
            if not message.tool_calls:
                answer = message.content or ""
                break
            # Echo the assistant message as returned so the proxy links the next turn to this call.
            messages = messages + [message.model_dump(exclude_none=True)]
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": self.call_tool(call.function.name, call.function.arguments)})
        return await compute_reward(self.reward_fn, data, answer)

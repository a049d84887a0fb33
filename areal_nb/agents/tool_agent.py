"""A tool-using agent in plain OpenAI SDK code: offer tools, run the calls the model makes, answer.

Each turn sends the conversation with `tools=[...]`; when the reply holds `tool_calls`, the agent
runs each named Python function on the JSON arguments and appends the results as `role: "tool"`
messages, then asks again; a reply without tool calls is the answer, scored by
`reward_fn(row, answer_text)`. The reward goes to that last call; the proxy discounts it back
over the tool-call turns (`agent.turn_discount`), and the conversation tree shows every turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from areal_nb.data.tool_task import CALCULATOR_TOOL, calculator
from areal_nb.reward import RewardFn, compute_reward, resolve_reward

from .sdk_agent import SDKAgent, echo, openai_client

DEFAULT_TOOLS: dict[str, tuple[dict, Callable[..., str]]] = {"calculator": (CALCULATOR_TOOL, calculator)}


class ToolAgent(SDKAgent):
    def __init__(
        self,
        reward_fn: RewardFn | str = "areal_nb.data.tool_task.answer_reward",
        max_turns: int = 3,
        model: str = "default",
        temperature: float | None = None,  # None: the server's default
        max_completion_tokens: int | None = None,
        tools: dict[str, tuple[dict, Callable[..., str]]] | None = None,
    ) -> None:
        super().__init__(max_turns, model, temperature, max_completion_tokens)
        self.reward_fn = resolve_reward(reward_fn)
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
        """The answer's reward (the proxy discounts it back over the tool-call turns)."""
        client = openai_client(**extra_kwargs)
        schemas = [schema for schema, _ in self.tools.values()]
        messages = list(data["messages"])
        answer = ""
        for _ in range(self.max_turns):
            completion = await self.chat(client, messages, tools=schemas)
            message = completion.choices[0].message
            if not message.tool_calls:
                answer = message.content or ""
                break
            messages = messages + [echo(message)]
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": self.call_tool(call.function.name, call.function.arguments)})
        return await compute_reward(self.reward_fn, data, answer)

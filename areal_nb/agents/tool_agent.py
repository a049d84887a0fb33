"""A tool-using agent in plain OpenAI SDK code: offer tools, run the calls the model makes, answer.

Each turn sends the conversation with `tools=[...]`; when the reply holds `tool_calls`, the agent
runs each named Python function on the JSON arguments and appends the results as `role: "tool"`
messages, then asks again; a reply without tool calls is the answer, scored by
`reward_fn(row, answer_text)`. The reward goes to that last call; the proxy discounts it back
over the tool-call turns (`agent.turn_discount`), and the conversation tree shows every turn.

Your own tools: `ToolAgent(tools={"name": (openai_tool_schema, fn)})`, `fn` sync or `async def`.
A sync tool runs in a worker thread (a slow one must not stall the event loop every episode and
the proxy share); a result that is not text is sent as JSON. Whatever goes wrong in a call — an
unknown tool, arguments that are not a JSON object, the tool raising — is sent to the model as
an "error: ..." result, never raised: the episode goes on and is scored, because a rejected
episode would drop exactly the mistake RL has to learn from.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from areal_nb.data.tool_task import CALCULATOR_TOOL, calculator
from areal_nb.errors import ArgumentTypeError
from areal_nb.reward import RewardFn, compute_reward, resolve_reward

from .sdk_agent import SDKAgent, echo, openai_client

_DEFAULT_TOOLS: dict[str, tuple[dict, Callable[..., str]]] = {"calculator": (CALCULATOR_TOOL, calculator)}


def _tool_text(result: Any) -> str:
    """A tool's result as the text of its `tool` message: text as is, anything else as JSON."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # e.g. a circular structure
        return str(result)


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
        self.tools = dict(_DEFAULT_TOOLS if tools is None else tools)

    def call_tool(self, name: str, arguments: str) -> str:
        """A sync tool's result as text (see the module doc); an async tool needs `acall_tool`."""
        fn, args = self._parse_call(name, arguments)
        if isinstance(fn, str):
            return fn
        if inspect.iscoroutinefunction(fn):
            raise ArgumentTypeError(f"tool {name!r} is async: use `await agent.acall_tool(name, arguments)`")
        try:
            return _tool_text(fn(**args))
        except Exception as e:  # the model's call went wrong: it is told so
            return f"error: {name} raised {type(e).__name__}: {e}"

    async def acall_tool(self, name: str, arguments: str) -> str:
        """The tool's result as text: async tools awaited, sync ones run in a worker thread."""
        fn, args = self._parse_call(name, arguments)
        if isinstance(fn, str):
            return fn
        try:
            result = fn(**args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, **args)
            if inspect.isawaitable(result):
                result = await result
            return _tool_text(result)
        except Exception as e:
            return f"error: {name} raised {type(e).__name__}: {e}"

    def _parse_call(self, name: str, arguments: str) -> tuple[Callable[..., Any] | str, dict[str, Any]]:
        """(the tool function, its keyword arguments), or (the error text for the model, {})."""
        if name not in self.tools:
            return f"error: no tool named {name!r}", {}
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return f"error: bad arguments for {name} ({e})", {}
        if not isinstance(args, dict):
            return f"error: bad arguments for {name} (expected a JSON object, got {type(args).__name__})", {}
        fn = self.tools[name][1]
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as e:
            return f"error: bad arguments for {name} ({e})", {}
        except ValueError:  # no signature to check (some builtins): the call itself will say
            pass
        return fn, args

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
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": await self.acall_tool(call.function.name, call.function.arguments),
                    }
                )
        return await compute_reward(self.reward_fn, data, answer)

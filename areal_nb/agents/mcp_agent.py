"""An OpenAI Agents SDK agent whose tools come from MCP servers, trained unchanged through the proxy.

Most agent frameworks get their tools over MCP: the agent lists a server's tools, offers them to
the model, and forwards the model's calls to the server. `MCPToolAgent` is such an agent, written
as the Agents SDK documents it (`Agent(mcp_servers=[MCPServerStdio(...)])`, `Runner.run`), with
only the model pointed at the proxy. By default its server is
`areal_nb.agents.calculator_mcp_server`, the tool task's calculator, so `configs/tool_use.yaml`
trains it on the built-in `tiny-tools` model (`agent__workflow=MCPToolAgent()`).

The model is the SDK's default kind, `OpenAIResponsesModel` (the Responses API). The SDK's
`OpenAIChatCompletionsModel` works through the proxy too, but it sends every tool with
`"strict": false`, which the chat template renders into the prompt with the rest of the tool's
JSON: a prompt `tiny-tools` was never shown, on which it seldom calls the tool. (The Responses
door passes a tool's name, description and parameters to the template, nothing else.)

A stdio server is a process: an interpreter start and the `mcp` import, seconds on a small
machine. Started inside `run`, as the SDK's examples do (`async with MCPServerStdio(...)`), that
is paid by every episode. `SharedMCPServers` starts the servers once per event loop instead and
hands the connected servers to every episode that runs on it: one set of processes per Session
(whose episodes all run on its loop), stopped by the Session's close (`aclose`). In
`agent.mode: subproc` each episode is its own event loop in a worker process, so each episode
starts its own servers there, stopped when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from areal_nb.errors import InvalidArgumentError
from areal_nb.reward import RewardFn, compute_reward, resolve_reward

from .sdk_agent import openai_client

logger = logging.getLogger(__name__)

CALCULATOR_SERVER_MODULE = "areal_nb.agents.calculator_mcp_server"
_CLOSE_TIMEOUT_S = 30.0  # the SDK's own stop gives a server 2 s after its stdin closes, then kills it


def python_module_server(module: str, *, startup_timeout: float = 60.0) -> Any:
    """`MCPServerStdio` running `python -m module` on this interpreter. The server's environment
    is the SDK's minimal one plus this process's PYTHONPATH, so it imports what this process does.
    `startup_timeout`: seconds one request may take, the first (the server's start) included."""
    from agents.mcp import MCPServerStdio

    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return MCPServerStdio(
        {"command": sys.executable, "args": ["-m", module], "env": env},
        name=module,
        cache_tools_list=True,  # the tools never change: not one `tools/list` round trip per turn
        client_session_timeout_seconds=startup_timeout,
    )


def calculator_servers() -> list[Any]:
    """The tool task's calculator (`areal_nb.agents.calculator_mcp_server`) as a stdio server."""
    return [python_module_server(CALCULATOR_SERVER_MODULE)]


class SharedMCPServers:
    """MCP servers connected once per event loop and shared by every episode that runs on it.

    `make_servers()` returns unconnected servers (e.g. `[MCPServerStdio(...)]`); `await get()`
    returns them connected. A server's connection belongs to the event loop that made it, so one
    task per loop connects them, holds them, and disconnects them (MCP's stdio transport must be
    closed by the task that opened it): on `aclose()`, or when the loop cancels it at its end
    (`asyncio.run`). A start that fails fails the episodes waiting for it; the next one tries again.
    """

    def __init__(self, make_servers: Callable[[], Sequence[Any]]) -> None:
        self.make_servers = make_servers
        self._held: dict[asyncio.AbstractEventLoop, tuple[asyncio.Task, asyncio.Future, asyncio.Event]] = {}

    async def get(self) -> list[Any]:
        loop = asyncio.get_running_loop()
        held = self._held.get(loop)
        if held is None or held[0].done():
            ready, stop = loop.create_future(), asyncio.Event()
            held = self._held[loop] = (loop.create_task(self._hold(ready, stop)), ready, stop)
        return await asyncio.shield(held[1])

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                servers = [await stack.enter_async_context(server) for server in self.make_servers()]
                ready.set_result(servers)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                ready.exception()  # (retrieved: no "never retrieved" warning if no episode waits)
            if not isinstance(exc, Exception):
                raise

    async def aclose(self) -> None:
        """Stop this loop's servers and wait until they are; those of other loops: `close()`."""
        held = self._held.pop(asyncio.get_running_loop(), None)
        if held is not None:
            task, _, stop = held
            stop.set()
            await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
        self.close()

    def close(self) -> None:
        """Stop the servers of every loop but the running one (use `aclose()` there)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, (task, _, stop) in list(self._held.items()):
            if loop is running:
                continue
            del self._held[loop]
            if loop.is_closed() or task.done():
                continue  # (a loop's end cancelled its task, which stopped the servers)
            if loop.is_running():  # another thread's loop
                asyncio.run_coroutine_threadsafe(_stop(task, stop), loop).result(_CLOSE_TIMEOUT_S)
            else:
                loop.run_until_complete(_stop(task, stop))


async def _stop(task: asyncio.Task, stop: asyncio.Event) -> None:
    stop.set()
    await asyncio.wait_for(task, _CLOSE_TIMEOUT_S)


class MCPToolAgent:
    """An Agents SDK agent whose tools are those of `servers()` (default: the MCP calculator).

    The answer (the run's final output) is scored by `reward_fn(row, answer)`; the proxy
    discounts the reward back over the tool-call turns. A run that used up `max_turns` model
    calls, or whose model called a tool the servers do not have, is scored on an empty answer:
    the mistake is what RL has to learn from, so the episode trains instead of being rejected.
    """

    def __init__(
        self,
        servers: Callable[[], Sequence[Any]] = calculator_servers,
        reward_fn: RewardFn | str = "areal_nb.data.tool_task.answer_reward",
        max_turns: int = 2,
        instructions: str | None = None,
        model: str = "default",
    ) -> None:
        if max_turns < 1:
            raise InvalidArgumentError(f"max_turns must be >= 1, got {max_turns}")
        self.reward_fn = resolve_reward(reward_fn)
        self.max_turns = max_turns
        self.instructions = instructions
        self.model = model
        self.servers = SharedMCPServers(servers)

    def __getstate__(self) -> dict[str, Any]:
        # subproc mode sends the agent by value: a copy holds no connection, it makes its own
        state = dict(self.__dict__)
        state["servers"] = SharedMCPServers(self.servers.make_servers)
        return state

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
        from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

        set_tracing_disabled(True)  # no traces sent to OpenAI
        agent = Agent(
            name="mcp-tools",
            instructions=self.instructions,
            model=OpenAIResponsesModel(model=self.model, openai_client=openai_client(**extra_kwargs)),
            mcp_servers=await self.servers.get(),
        )
        try:
            result = await Runner.run(agent, list(data["messages"]), max_turns=self.max_turns)
            answer = str(result.final_output or "")
        except (MaxTurnsExceeded, ModelBehaviorError) as exc:
            logger.debug("episode scored on an empty answer: %s", exc)
            answer = ""
        return await compute_reward(self.reward_fn, data, answer)

    async def aclose(self) -> None:
        """Stop the MCP servers (the Session awaits this on its loop when it closes)."""
        await self.servers.aclose()

    def close(self) -> None:
        self.servers.close()

"""Agents used by the proxy tests, importable as `tests.proxy.agents.<Name>` (also in subprocesses).

Each is ordinary SDK code: it reads the proxy address and session key from the injected
kwargs (inline mode) or from the environment (subproc mode).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Self

from areal_nb.api import RolloutWorkflow


def _openai_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        "base_url": kw.get("base_url") or os.environ["OPENAI_BASE_URL"],
        "api_key": kw.get("api_key") or os.environ["OPENAI_API_KEY"],
        "http_client": kw.get("http_client"),
        "max_retries": 0,
    }


def _async_openai(kw: dict[str, Any]):
    from openai import AsyncOpenAI

    return AsyncOpenAI(**_openai_kwargs(kw))


class ChatAgent:
    """`turns` chat calls, each echoing the previous reply; returns `data["ret"]` when given.

    Without `ret`: returns `{completion_id: turn_index + 1}` for every turn (a dict reward).
    `ret == "last_int"` returns the int 1; other values are returned unchanged (tests of the
    reward contract). Inline, `self.seen` collects (completion id, reply text) for the test.
    """

    def __init__(self, turns: int = 1, max_tokens: int = 8, stream: bool = False) -> None:
        self.turns = turns
        self.max_tokens = max_tokens
        self.stream = stream
        self.seen: list[tuple[str, str]] = []  # (completion id, reply text), inline mode only

    async def run(self, data: dict[str, Any], **kw: Any) -> Any:
        client = _async_openai(kw)
        messages = data["messages"]
        ids: list[str] = []
        for turn in range(self.turns):
            if self.stream:
                text, cid = "", None
                stream = await client.chat.completions.create(
                    model="default", messages=messages, max_completion_tokens=self.max_tokens, stream=True
                )
                async for chunk in stream:
                    cid = chunk.id
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
                assistant = {"role": "assistant", "content": text}
            else:
                completion = await client.chat.completions.create(
                    model="default", messages=messages, max_completion_tokens=self.max_tokens
                )
                cid = completion.id
                assistant = completion.choices[0].message.model_dump(exclude_none=True)
            ids.append(cid)
            self.seen.append((cid, assistant["content"]))
            messages.append(assistant)  # mutates its own copy of data (the workflow deep-copies)
            messages.append({"role": "user", "content": f"turn {turn + 2}, continue"})
        if "ret" in data:
            return 1 if data["ret"] == "last_int" else data["ret"]
        return {cid: float(i + 1) for i, cid in enumerate(ids)}


class SyncOpenAIAgent:
    """Subproc mode: the synchronous `openai.OpenAI` client configured only by the environment."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from openai import OpenAI

        client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the env
        completion = client.chat.completions.create(
            model="default", messages=data["messages"], max_completion_tokens=8
        )
        assert completion.choices[0].message.role == "assistant"
        return 0.5


class AnthropicAgent:
    """`anthropic.AsyncAnthropic` against the proxy root; plain or streaming."""

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from anthropic import AsyncAnthropic

        base = kw.get("base_url")
        client = AsyncAnthropic(
            base_url=base.removesuffix("/v1") if base else os.environ["ANTHROPIC_BASE_URL"],
            api_key=kw.get("api_key") or os.environ["ANTHROPIC_API_KEY"],
            # The injected http_client is an `httpx.AsyncClient`; this anthropic release is built
            # on `httpx2` and refuses it, so the SDK keeps its own connection pool.
            max_retries=0,
        )
        if self.stream:
            async with client.messages.stream(
                model="default", max_tokens=8, messages=data["messages"]
            ) as stream:
                message = await stream.get_final_message()
        else:
            message = await client.messages.create(model="default", max_tokens=8, messages=data["messages"])
        assert message.role == "assistant"
        return 2.0


class ToolAgent:
    """OpenAI Agents SDK agent with one function tool; returns 1.0 when the final answer says 3."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

        set_tracing_disabled(True)

        @function_tool
        def add(a: int, b: int) -> str:
            """Add two integers."""
            return f"SUM={a + b}"

        model = OpenAIChatCompletionsModel(model="default", openai_client=_async_openai(kw))
        agent = Agent(name="adder", instructions="Use the add tool.", model=model, tools=[add])
        result = await Runner.run(agent, data["messages"][-1]["content"])
        return 1.0 if "3" in str(result.final_output) else 0.0


class RaisingAgent:
    """Makes one call, then fails."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        await _async_openai(kw).chat.completions.create(
            model="default", messages=data["messages"], max_completion_tokens=4
        )
        raise RuntimeError("agent bug after the first call")


class HangingAgent:
    """Makes one call, then never returns (async sleep inline; a blocking sleep in subproc)."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        await _async_openai(kw).chat.completions.create(
            model="default", messages=data["messages"], max_completion_tokens=4
        )
        if kw:
            await asyncio.sleep(3600)
        time.sleep(3600)  # noqa: ASYNC251 - subproc: a worker stuck in synchronous code
        return 1.0


class NoCallAgent:
    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        return 1.0


class SyncRunAgent:
    """Not async: rejected by inline mode at construction time."""

    def run(self, data: dict[str, Any], **kw: Any) -> float:
        return 1.0


def crash_reward(*args: Any, **kwargs: Any) -> float:
    os._exit(3)  # takes the reward worker process down


def hang_reward(*args: Any, **kwargs: Any) -> float:
    time.sleep(3600)
    return 1.0


class RewardFnAgent:
    """One chat call, then its reward from `AsyncRewardWrapper(<reward_fn named in data>)`."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from areal_nb.reward import AsyncRewardWrapper

        completion = await _async_openai(kw).chat.completions.create(
            model="default", messages=data["messages"], max_completion_tokens=4
        )
        fn = {"crash": crash_reward, "hang": hang_reward}[data["reward_fn"]]
        with AsyncRewardWrapper(fn, timeout_seconds=1.0, max_workers=1, max_retries=0) as wrapper:
            return await wrapper(completion.choices[0].message.content)


class ConstWorkflow(RolloutWorkflow):
    """A plain RolloutWorkflow for resolution tests: returns `{"x": value}`."""

    def __init__(self, value: Any = 1) -> None:
        self.value = value

    async def arun_episode(self, engine, data):
        return {f"id-{self.value}": self.value}


CONST_WORKFLOW = ConstWorkflow(7)
AGENT_INSTANCE = ChatAgent(turns=2)


# ----------------------------------------------------------------------------- test servers
ADMIN_KEY = "test-admin-key"


class serve_proxy:
    """A real proxy (uvicorn on 127.0.0.1, free port) around `engine`; `with serve_proxy(...) as p:`.

    `p.url` is the proxy root, `p.app` the FastAPI app, `p.state` its ProxyState.
    """

    def __init__(self, engine: Any, tokenizer: Any, **settings: Any) -> None:
        from areal_nb.proxy import ProxyServer, ProxySettings, create_app

        settings.setdefault("admin_api_key", ADMIN_KEY)
        self.engine = engine
        self.app = create_app(engine, tokenizer, ProxySettings(**settings))
        self.server = ProxyServer(self.app, host="127.0.0.1", port=0)

    @property
    def url(self) -> str:
        return self.server.url.rstrip("/")

    @property
    def state(self) -> Any:
        return proxy_state(self.app)

    def __enter__(self) -> Self:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def proxy_state(app: Any) -> Any:
    """The app's ProxyState (sessions, key map): the proxy keeps no module globals."""
    return app.state.proxy


def live_sessions(app: Any, settle_s: float = 10.0) -> tuple[dict, dict]:
    """(sessions, key → session map) still held by the proxy.

    The proxy removes an exported session only after the export's response went out, so a client
    can hold the data a moment before the removal: wait (at most `settle_s`) for exports still
    being sent to settle before looking.
    """
    state = proxy_state(app)
    deadline = time.monotonic() + settle_s
    while any(s.exporting for s in list(state.sessions.values())) and time.monotonic() < deadline:
        time.sleep(0.01)
    return dict(state.sessions), dict(state._key_to_session)

"""One agent episode through the real proxy app in-process, against a scripted model: the
helper the SDK-agent and multi-agent tests share (`tests.scripted_episode.run_episode`)."""

from __future__ import annotations

import asyncio
from typing import Any

from areal_nb.proxy import ProxySettings, create_app
from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from areal_nb.testing import ScriptedEngine

ADMIN_KEY = "scripted-episode-admin-key"
QUESTION = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}


def run_episode(
    tokenizer, agent: Any, replies: list[str], data: dict[str, Any] = QUESTION, *, discount: float
):
    """(the episode's interactions in call order, the requests the model got); the model answers
    `replies` in order. `discount` is the reward discount of the export (0: each interaction keeps
    the reward the agent gave its completion)."""
    script = iter(replies)
    engine = ScriptedEngine(tokenizer, lambda req: next(script))
    app = create_app(engine, tokenizer, ProxySettings(admin_api_key=ADMIN_KEY))
    wf = OpenAIProxyWorkflow(
        agent=agent,
        proxy_addr="http://proxy.invalid:9",
        admin_api_key=ADMIN_KEY,
        asgi_app=app,
        discount=discount,
    )

    async def run():
        try:
            return await wf.arun_episode(None, data)
        finally:
            await wf.aclose()

    out = asyncio.run(run())
    assert wf.last_rejection_reason is None, wf.last_rejection_reason
    return list(out.values()), engine.requests

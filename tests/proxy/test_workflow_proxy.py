"""OpenAIProxyWorkflow: construction errors, the reward contract, per-task rejection reasons,
cancellation cleanup, and the subprocess entry's environment handling."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from areal_nb.api import NotSerializableError
from areal_nb.api.by_value import dumps_by_value
from areal_nb.rollout.workflow import (
    EpisodeRejected,
    OpenAIProxyWorkflow,
    _run_agent_in_subprocess,
    parse_agent_rewards,
)
from areal_nb.testing import ScriptedEngine
from tests.proxy import agents
from tests.proxy.agents import ADMIN_KEY, live_sessions, serve_proxy

ROOT = Path(__file__).resolve().parents[2]
OK = {"messages": [{"role": "user", "content": "q"}]}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1.0),
        (0, 0.0),
        (-2.5, -2.5),
        (np.float32(0.5), 0.5),
        (np.int64(3), 3.0),
        ({"a": 1, "b": 0.25}, {"a": 1.0, "b": 0.25}),
    ],
)
def test_valid_rewards(value, expected):
    out = parse_agent_rewards(value)
    assert out == expected and (type(out) is float or all(type(v) is float for v in out.values()))


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        np.bool_(True),
        None,
        "1",
        [1.0],
        (1.0,),
        math.inf,
        -math.nan,
        {},
        {1: 1.0},
        {"a": None},
        {"a": math.inf},
        {"a": True},
    ],
)
def test_invalid_rewards(value):
    with pytest.raises(EpisodeRejected) as err:
        parse_agent_rewards(value)
    assert err.value.kind == "invalid_reward"


def test_constructor_errors():
    good = {"agent": agents.ChatAgent(), "proxy_addr": "http://127.0.0.1:1", "admin_api_key": "k"}
    cases = [
        ({"mode": "online"}, ValueError, "mode must be one of"),
        ({"agent": None}, ValueError, "needs an agent"),
        ({"agent": object()}, TypeError, "no callable `run"),
        ({"agent": agents.SyncRunAgent()}, TypeError, "must be `async def` in inline mode"),
        ({"proxy_addr": ""}, ValueError, "needs proxy_addr"),
        ({"admin_api_key": ""}, ValueError, "admin_api_key"),
        ({"export_style": "tree"}, ValueError, "Invalid export style"),
        ({"discount": 1.5}, ValueError, "discount must be in"),
        ({"subproc_max_workers": 0}, ValueError, "subproc_max_workers"),
        ({"agent_timeout": 0}, ValueError, "agent_timeout must be positive"),
    ]
    for override, exc, message in cases:
        with pytest.raises(exc, match=message):
            OpenAIProxyWorkflow(**{**good, **override})
    wf = OpenAIProxyWorkflow(**{**good, "proxy_addr": "http://127.0.0.1:1/v1/"})
    assert wf.proxy_addr == "http://127.0.0.1:1"  # normalised to the proxy root


class _EnvAgent:
    async def run(self, data, **kw):
        return {k: os.environ[k] for k in data["keys"]}


def test_subprocess_entry_sets_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "outer")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    env = {"OPENAI_API_KEY": "session-key", "ANTHROPIC_API_KEY": "session-key"}
    row = dumps_by_value({"keys": list(env)}, "row")
    seen = _run_agent_in_subprocess(dumps_by_value(_EnvAgent(), "agent"), row, env)
    assert seen == env
    assert os.environ["OPENAI_API_KEY"] == "outer" and "ANTHROPIC_API_KEY" not in os.environ
    # a sync run is called as is
    assert (
        _run_agent_in_subprocess(
            dumps_by_value(agents.SyncRunAgent(), "agent"), dumps_by_value({}, "row"), {}
        )
        == 1.0
    )


class _ClosingAgent:
    """Records how it was closed, and on which event loop."""

    def __init__(self, fail_aclose: bool = False):
        self.closed: list[tuple[str, object]] = []
        self.fail_aclose = fail_aclose

    async def run(self, data, **kw):
        return 1.0

    async def aclose(self):
        self.closed.append(("aclose", asyncio.get_running_loop()))
        if self.fail_aclose:
            raise RuntimeError("the agent's resources would not close")

    def close(self):
        self.closed.append(("close", None))


@pytest.mark.parametrize("fail_aclose", [False, True])
def test_aclose_awaits_the_agents_aclose_on_its_loop_then_calls_close(fail_aclose):
    agent = _ClosingAgent(fail_aclose)
    wf = OpenAIProxyWorkflow(agent=agent, proxy_addr="http://127.0.0.1:1", admin_api_key=ADMIN_KEY)

    async def close_it():
        await wf.aclose()
        return asyncio.get_running_loop()

    loop = asyncio.run(close_it())
    assert agent.closed == [("aclose", loop), ("close", None)]  # a failing aclose does not stop close
    wf.close()  # the sync close (no loop) calls close only
    assert [how for how, _ in agent.closed] == ["aclose", "close", "close"]


class _SocketAgent:
    def __init__(self):
        self.conn = socket.socket()

    def run(self, data, **kw):
        return 1.0


def test_subproc_agent_that_cannot_travel_is_refused_naming_the_attribute():
    agent = _SocketAgent()
    try:
        with pytest.raises(
            NotSerializableError, match=r"agent '_SocketAgent instance'.*attribute 'conn' \(socket\)"
        ):
            OpenAIProxyWorkflow(
                mode="subproc", agent=agent, proxy_addr="http://127.0.0.1:1", admin_api_key="k"
            )
    finally:
        agent.conn.close()


MAIN_SCRIPT = """
import asyncio, sys
from openai import OpenAI
from areal_nb.rollout.workflow import OpenAIProxyWorkflow

BONUS = 0.75


class CellAgent:  # defined in __main__, like a class in a notebook cell; sync SDK code
    def __init__(self, reward):
        self.reward = reward

    def run(self, data):
        reply = OpenAI(max_retries=0).chat.completions.create(
            model="default", messages=data["messages"], max_completion_tokens=4)
        return self.reward(reply.choices[0].message.content)

async def main(url, key):
    wf = OpenAIProxyWorkflow(mode="subproc", agent=CellAgent(lambda text: BONUS * (len(text) > 0)),
                             proxy_addr=url, admin_api_key=key, subproc_max_workers=1)
    out = await wf.arun_episode(None, {"messages": [{"role": "user", "content": "q"}]})
    await wf.aclose()
    [interaction] = out.values()
    print(wf.last_rejection_reason, interaction.reward)

if __name__ == "__main__":  # spawn re-imports a script's main module (a notebook has none)
    asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.server
def test_subproc_agent_defined_in_main_runs_through_the_proxy(proxy, tmp_path):
    script = tmp_path / "cell_like.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), proxy.url, ADMIN_KEY],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None 0.75"


@pytest.fixture(scope="module")
def proxy(tiny_tokenizer):
    with serve_proxy(ScriptedEngine(tiny_tokenizer, "The answer is 7"), tiny_tokenizer) as p:
        yield p


@pytest.mark.server
def test_rejection_reason_is_per_task_under_concurrency(proxy):
    wf = OpenAIProxyWorkflow(agent=agents.ChatAgent(), proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)

    async def one(data):
        result = await wf.arun_episode(None, data)
        return result, wf.last_rejection_reason

    async def main():
        out = await asyncio.gather(*(one({**OK, "ret": "bad"} if i % 2 else OK) for i in range(6)))
        await wf.aclose()
        return out

    for i, (result, reason) in enumerate(asyncio.run(main())):
        if i % 2:
            assert result is None and reason.startswith("invalid_reward: ") and "got str" in reason
        else:
            assert result is not None and reason is None
    assert wf.accepted == 3 and wf.rejections == {"invalid_reward": 3}
    assert live_sessions(proxy.app) == ({}, {})


@pytest.mark.server
def test_cancelled_episode_still_frees_its_session(proxy):
    wf = OpenAIProxyWorkflow(agent=agents.HangingAgent(), proxy_addr=proxy.url, admin_api_key=ADMIN_KEY)

    async def main():
        task = asyncio.create_task(wf.arun_episode(None, OK))
        for _ in range(200):  # until the agent's call is recorded and it hangs
            await asyncio.sleep(0.02)
            if any(len(s.cache) for s in proxy.state.sessions.values()):
                break
        assert proxy.state.sessions
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wf.aclose()

    asyncio.run(main())
    assert live_sessions(proxy.app) == ({}, {})

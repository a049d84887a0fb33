"""An OpenAI Agents SDK agent whose tool comes from a stdio MCP server trains unchanged.

`MCPToolAgent` lists the calculator of `areal_nb.agents.calculator_mcp_server` (a real `mcp`
server in a child process) and runs the model's calls there; the built-in `tiny-tools` model
calls it as it was warm-started to. The recorded rows hold the tool call (trained on) and the
server's result (not trained on), and one server process serves the whole Session.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import psutil
import pytest

from areal_nb.agents.mcp_agent import (
    CALCULATOR_SERVER_MODULE,
    MCPToolAgent,
    SharedMCPServers,
    calculator_servers,
    python_module_server,
)
from areal_nb.data.tool_task import CALCULATOR_TOOL, calculator

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tool_use.yaml"
SMALL = [
    "rollout.batch_size=4",
    "rollout.group_size=2",
    "data.eval_size=8",
    "logging.eval_every=0",
    "logging.progress=false",
]


def server_pids(module: str = CALCULATOR_SERVER_MODULE) -> set[int]:
    """The pids of this process's descendants running `python -m module` (zombies are gone)."""
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if module in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                out.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def no_server_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while server_pids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.server
def test_episodes_on_one_loop_share_one_server_which_stops_with_the_loop_or_aclose():
    shared = SharedMCPServers(calculator_servers)

    async def episodes() -> tuple[set[int], int]:
        # eight concurrent first episodes: one server is started, and every episode gets it
        got = await asyncio.gather(*(shared.get() for _ in range(8)))
        assert all(servers[0] is got[0][0] for servers in got)
        results = await asyncio.gather(
            *(got[0][0].call_tool("calculator", {"expression": f"{n}*11"}) for n in range(8))
        )
        assert [r.content[0].text for r in results] == [str(n * 11) for n in range(8)]
        return server_pids(), id(got[0][0])

    async def closed_by_aclose() -> int:
        pids, first = await episodes()
        assert len(pids) == 1
        await shared.aclose()
        assert not server_pids()  # aclose returns once the process is gone
        return first

    first = asyncio.run(closed_by_aclose())
    # a loop that ends without aclose (asyncio.run cancels the task holding the server) stops it too
    pids, second = asyncio.run(episodes())
    assert len(pids) == 1 and second != first  # a new loop, a new connection
    assert no_server_within(10)
    shared.close()


@pytest.mark.server
def test_a_server_that_cannot_start_fails_its_episodes_and_the_next_one_tries_again():
    made = []

    def broken():
        made.append(1)
        return [python_module_server("areal_nb.no_such_module", startup_timeout=30)]

    shared = SharedMCPServers(broken)

    async def episodes():
        outcomes = await asyncio.gather(shared.get(), shared.get(), return_exceptions=True)
        assert all(isinstance(o, Exception) for o in outcomes), outcomes
        with pytest.raises(Exception):  # noqa: B017 - the SDK's error for a server that exited
            await shared.get()

    asyncio.run(episodes())
    assert len(made) == 2  # one start shared by the two concurrent episodes, then one more
    assert not server_pids("areal_nb.no_such_module")


@pytest.mark.slow
def test_the_mcp_agent_trains_and_its_rows_hold_the_call_and_the_servers_result():
    from areal_nb import Session
    from areal_nb.config import load_config

    before = server_pids()
    with Session(load_config(CONFIG, SMALL), agent__workflow=MCPToolAgent()) as s:
        servers_seen, tool_turns = set(), 0
        for _ in range(2):
            batch = s.rollout()
            assert not batch.rejected, s.executor.rejection_reasons
            servers_seen |= server_pids() - before
            rows = {id(row.interaction): row for row in batch.rows()}
            for i in range(len(batch.episodes)):
                calls = batch.calls(i)
                if len(calls) != 2:
                    continue
                tool_turns += 1
                call, answer = calls
                # the model was shown the calculator exactly as it was warm-started on it
                prompt = s.tokenizer.decode(call.model_response.input_tokens)
                assert json.dumps(CALCULATOR_TOOL) in prompt
                tool_call = call.output_message_list[0]["tool_calls"][0]
                expression = json.loads(tool_call["function"]["arguments"])["expression"]
                assert answer.parent is call and tool_call["function"]["name"] == "calculator"
                result = answer.messages[-1]  # what the MCP server answered, sent back by the SDK
                assert result == {
                    "role": "tool",
                    "content": calculator(expression),
                    "tool_call_id": tool_call["id"],
                }
                # the answer's row (concat export) runs prompt | tool call | tool result | answer:
                # the model's tokens are trained on, the server's result is not
                token_row = rows[id(answer)].interaction.token_row()
                runs: list[tuple[int, list[int]]] = []
                for token, mask in zip(token_row.input_ids, token_row.loss_mask, strict=True):
                    if not runs or runs[-1][0] != mask:
                        runs.append((mask, []))
                    runs[-1][1].append(token)
                assert [mask for mask, _ in runs] == [0, 1, 0, 1]
                assert runs[1][1] == call.model_response.output_tokens
                assert runs[3][1] == answer.model_response.output_tokens
                assert f"<tool_response>\n{calculator(expression)}\n</tool_response>" in s.tokenizer.decode(
                    runs[2][1]
                )
                assert "<tool_call>" in s.tokenizer.decode(runs[1][1])
                # the batch discounts the agent's reward back to the tool call (γ 0.9)
                discounted = batch.discounted(i)
                assert discounted[call.interaction_id] == pytest.approx(0.9 * answer.reward)
            s.train_step(batch)
        assert tool_turns > 0, "the model called the calculator in none of 16 episodes"
        assert s.version == 2
        assert len(servers_seen) == 1, servers_seen  # one server process for every episode
    assert no_server_within(10)  # and it stopped with the Session

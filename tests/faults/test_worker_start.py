"""Worker processes (reward functions, subproc agents) start from any main program, and a worker
that cannot start says why, with its own traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

REWARD_FROM_STDIN = textwrap.dedent("""
    import asyncio
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper

    def double(x):  # defined in a main program that has no file
        return 2.0 * x

    wrapper = AsyncRewardWrapper(double, max_workers=1, max_retries=0)
    print("reward", asyncio.run(wrapper(21)))
    wrapper.close()
""")


@pytest.mark.server  # a Python program in a subprocess
def test_a_reward_function_defined_in_a_program_read_from_stdin_runs_in_its_worker(tmp_path):
    done = subprocess.run(
        [sys.executable, "-"],
        input=REWARD_FROM_STDIN,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reward 42.0" in done.stdout


UNIMPORTABLE_MAIN = textwrap.dedent("""
    import asyncio
    import dataclasses
    if __name__ != "__main__":  # what a worker would run first if it ran this program again
        raise RuntimeError("this program cannot be imported by a worker")
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper

    @dataclasses.dataclass
    class Row:  # a class of the main program in the reward's arguments
        target: int

    def score(row, reply):  # defined here, at top level, with no main guard
        return float(reply == row.target)

    async def main():
        # two workers: the second starts on a later call, from another submit than the first
        return await asyncio.gather(*(wrapper(Row(n), 2) for n in range(4)))

    wrapper = AsyncRewardWrapper(score, max_workers=2, max_retries=0)
    print("rewards", asyncio.run(main()))
    wrapper.close()
""")


@pytest.mark.server  # a Python program in a subprocess
@pytest.mark.parametrize("how", ["file", "module"])
def test_a_reward_defined_in_an_unguarded_main_program_runs_in_workers_that_do_not_rerun_it(tmp_path, how):
    # `python job.py` sends spawn workers the file to run, `python -m job` the module name
    (tmp_path / "job.py").write_text(UNIMPORTABLE_MAIN)
    command = [sys.executable, "job.py"] if how == "file" else [sys.executable, "-m", "job"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rewards [0.0, 0.0, 1.0, 0.0]" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "cannot be imported by a worker" not in done.stderr


WORKERS_CANNOT_START = textwrap.dedent("""
    import asyncio, os
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper, RewardWorkerCrashedError

    os.getcwd = lambda: "/no/such/folder"  # the folder a worker is told to enter first
    wrapper = AsyncRewardWrapper(abs, max_workers=1, max_retries=3)
    try:
        asyncio.run(wrapper(-1))
    except RewardWorkerCrashedError as e:
        print("ERROR>>", e)
    wrapper.close()
""")


@pytest.mark.server  # a Python program in a subprocess
def test_a_worker_that_cannot_start_reports_its_own_traceback(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(WORKERS_CANNOT_START)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.split("ERROR>>", 1)[1]
    assert "its worker processes cannot start" in message
    assert "Traceback" in message and "FileNotFoundError" in message and "/no/such/folder" in message
    assert "on all 4 attempts" not in message  # said once, not retried


def test_why_spawn_fails_is_none_when_workers_can_start():
    from areal_nb.api.spawn import why_spawn_fails

    assert why_spawn_fails() is None


SESSION_FROM_STDIN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from areal_nb import Session
    from tests.faults.conftest import small_config

    with Session(small_config()) as s:  # the math agent: its reward runs in worker processes
        batch = s.rollout(1)
        print("accepted", len(batch.accepted), "rejected", [ep.rejection_reason for ep in batch.rejected])
""")


@pytest.mark.slow
def test_a_session_started_from_stdin_scores_its_episodes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-"],
        input=SESSION_FROM_STDIN.format(root=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accepted 2 rejected []" in done.stdout, done.stdout + done.stderr[-2000:]


# A training script as most are written: everything at top level, no `if __name__ == "__main__":`.
# Its reward worker processes (the math agent's) must not run it again.
TOP_LEVEL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from areal_nb import Session
    from tests.faults.conftest import small_config

    session = Session(small_config())
    history = session.run(2)
    print("steps", list(history["step"]), "rejected", int(history["rejected"].sum()))
    session.close()
""")

# The agent and its reward defined in the script itself, unguarded, run in `subproc` workers.
TOP_LEVEL_SUBPROC_AGENT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from areal_nb import Session
    from areal_nb.agents.chat_agent import ChatAgent
    from tests.faults.conftest import small_config

    def ends_with_target(row, reply):
        return reply.strip().endswith(str(row["target"]))

    class ScriptAgent(ChatAgent):
        pass

    rows = [{{"prompt": f"{{a}}+{{a}}=", "target": 2 * a}} for a in range(1, 9)]
    session = Session(
        small_config(agent__mode="subproc"),
        dataset=rows,
        eval_dataset=rows[:2],
        agent__workflow=ScriptAgent(reward_fn=ends_with_target),
        agent__subproc_max_workers=2,
    )
    row = session.step()
    print("steps", row["step"], "episodes", row["episodes"], "rejected", row["rejected"])
    session.close()
""")


def _run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(text.format(root=str(ROOT)))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path
    )


@pytest.mark.slow
def test_a_script_with_a_top_level_session_trains(tmp_path):
    done = _run_script(tmp_path, TOP_LEVEL_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps [1, 2] rejected 0" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "bootstrapping phase" not in done.stderr


@pytest.mark.slow
def test_a_script_with_a_top_level_session_runs_its_own_agent_in_subprocesses(tmp_path):
    done = _run_script(tmp_path, TOP_LEVEL_SUBPROC_AGENT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps 1 episodes 4 rejected 0" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "bootstrapping phase" not in done.stderr

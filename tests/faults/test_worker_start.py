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

REWARD_FROM_STDIN = textwrap.dedent('''
    import asyncio
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper

    def double(x):  # defined in a main program that has no file
        return 2.0 * x

    wrapper = AsyncRewardWrapper(double, max_workers=1, max_retries=0)
    print("reward", asyncio.run(wrapper(21)))
    wrapper.close()
''')


def test_a_reward_function_defined_in_a_program_read_from_stdin_runs_in_its_worker(tmp_path):
    done = subprocess.run([sys.executable, "-"], input=REWARD_FROM_STDIN, capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reward 42.0" in done.stdout


UNIMPORTABLE_MAIN = textwrap.dedent('''
    import asyncio
    if __name__ != "__main__":  # what a spawned worker runs first: this file again, as __mp_main__
        raise RuntimeError("this program cannot be imported by a worker")
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper, RewardWorkerCrashedError

    wrapper = AsyncRewardWrapper(abs, max_workers=1, max_retries=3)
    try:
        asyncio.run(wrapper(-1))
    except RewardWorkerCrashedError as e:
        print("ERROR>>", e)
    wrapper.close()
''')


def test_a_worker_that_cannot_start_reports_its_own_traceback(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(UNIMPORTABLE_MAIN)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.split("ERROR>>", 1)[1]
    assert "its worker processes cannot start" in message
    assert "Traceback" in message and "RuntimeError: this program cannot be imported by a worker" in message
    assert "on all 4 attempts" not in message  # said once, not retried


def test_why_spawn_fails_is_none_when_workers_can_start():
    from areal_nb.api.spawn import why_spawn_fails

    assert why_spawn_fails() is None


SESSION_FROM_STDIN = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    from areal_nb import Session
    from tests.faults.conftest import small_config

    with Session(small_config()) as s:  # the math agent: its reward runs in worker processes
        batch = s.rollout(1)
        print("accepted", len(batch.accepted), "rejected", [ep.rejection_reason for ep in batch.rejected])
''')


@pytest.mark.slow
def test_a_session_started_from_stdin_scores_its_episodes(tmp_path):
    done = subprocess.run([sys.executable, "-"], input=SESSION_FROM_STDIN.format(root=str(ROOT)),
                          capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accepted 2 rejected []" in done.stdout, done.stdout + done.stderr[-2000:]

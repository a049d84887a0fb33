"""A worker stuck in user code does not hold the interpreter's exit.

At exit the standard library waits for every process pool's pending jobs. A reward function or a
subproc agent that never returns, in a pool nobody shut down (a Session left open, a notebook
kernel asked to quit), would keep the process alive for ever; areal_nb's pools kill such workers
first. Each program below leaves a job stuck in a worker and falls off its end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

STUCK_REWARD = textwrap.dedent("""
    import asyncio, sys, threading, time
    from pathlib import Path
    from areal_nb.reward.async_wrapper import AsyncRewardWrapper

    def stuck(marker):
        Path(marker).write_text("inside")
        time.sleep(3600)

    if __name__ == "__main__":
        wrapper = AsyncRewardWrapper(stuck, timeout_seconds=3600, max_workers=1, max_retries=0)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(wrapper(sys.argv[1]), loop)
        while not Path(sys.argv[1]).exists():
            time.sleep(0.2)
        print("the reward function is stuck; leaving", flush=True)
""")

# spawn_pool's workers start without the main program, so a job sent to one by plain pickle
# names an importable function (areal_nb's own pools send user code by value instead).
STUCK_JOB_MODULE = textwrap.dedent("""
    import time
    from pathlib import Path

    def stuck(marker):
        Path(marker).write_text("inside")
        time.sleep(3600)
""")

STUCK_POOL_JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from areal_nb.api.spawn import spawn_pool
    from stuck_job import stuck

    if __name__ == "__main__":
        pool = spawn_pool(2)
        pool.submit(stuck, sys.argv[1])
        while not Path(sys.argv[1]).exists():
            time.sleep(0.2)
        del pool  # dropped without a shutdown
        print("the job is stuck; leaving", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("program", [STUCK_REWARD, STUCK_POOL_JOB], ids=["reward-wrapper", "spawn-pool"])
def test_a_program_with_a_worker_stuck_in_user_code_exits(tmp_path, program):
    script = tmp_path / "main.py"
    script.write_text(program)
    (tmp_path / "stuck_job.py").write_text(STUCK_JOB_MODULE)
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "marker")],
            capture_output=True,
            text=True,
            timeout=240,
            env=ENV,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program did not exit: its stuck worker held the interpreter\n{exc.stdout}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "leaving" in done.stdout

"""AsyncRewardWrapper against real worker processes: success, crashes, hangs, shutdown."""

import asyncio
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from areal_nb.api import NotSerializableError
from areal_nb.reward import (
    AsyncRewardWrapper,
    RewardFunctionError,
    RewardTimeoutError,
    RewardWorkerCrashedError,
    gsm8k_reward_fn,
)

# Spawned workers import reward functions by module name: make `faulty_rewards` importable.
sys.path.insert(0, str(Path(__file__).parent))
import faulty_rewards  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child not yet reaped is a zombie: count it as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _pool_pids() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.name.startswith("SpawnProcess")}


@pytest.fixture
def wrappers():
    made = []

    def make(fn, **kw):
        kw.setdefault("max_workers", 1)
        w = AsyncRewardWrapper(fn, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
    assert _pool_pids() == set()


def test_math_reward_in_worker_processes(wrappers):
    w = wrappers(gsm8k_reward_fn, timeout_seconds=30)

    async def run():
        return await asyncio.gather(
            w(completions="The answer is \\boxed{7}", answer="#### 7"),
            w(completions="The answer is 8", answer="#### 7"),
            w(prompt="p", completions="-3", prompt_ids=[1], completion_ids=[2], answer="-3"),
        )

    assert asyncio.run(run()) == [1.0, 0.0, 1.0]
    assert asyncio.run(w(completions="x", answer="1")) == 0.0


@pytest.mark.slow  # worker processes crash, hang or restart
def test_crash_raises_after_retries_and_next_call_succeeds(wrappers, tmp_path, caplog):
    log = tmp_path / "attempts.txt"
    crashing = wrappers(faulty_rewards.log_pid_then_crash, timeout_seconds=30, max_retries=2)
    with pytest.raises(
        RewardWorkerCrashedError, match="log_pid_then_crash crashed its worker process on all 3"
    ):
        asyncio.run(crashing(str(log)))
    assert len(log.read_text().split()) == 3  # one fresh worker per attempt
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records if "attempt" in r.getMessage()] == [
        "worker process died (attempt 1/3)",
        "worker process died (attempt 2/3)",
        "worker process died (attempt 3/3)",
    ]
    healthy = wrappers(gsm8k_reward_fn, timeout_seconds=30)
    assert asyncio.run(healthy(completions="12", answer="#### 12")) == 1.0


@pytest.mark.slow  # worker processes crash, hang or restart
def test_pool_is_rebuilt_after_a_crash(wrappers, tmp_path):
    w = wrappers(faulty_rewards.crash_first_time, timeout_seconds=30, max_retries=1)
    assert asyncio.run(w(str(tmp_path / "crashed-once"))) == 1.0


@pytest.mark.slow  # worker processes crash, hang or restart
def test_hang_times_out_kills_the_worker_and_next_call_is_prompt(wrappers, tmp_path):
    log = tmp_path / "hung.txt"
    hanging = wrappers(faulty_rewards.log_pid_then_hang, timeout_seconds=1.0, max_retries=1)
    with pytest.raises(RewardTimeoutError, match="timed out .* on all 2 attempts"):
        asyncio.run(hanging(str(log)))
    hung_pids = [int(p) for p in log.read_text().split()]
    assert len(hung_pids) == 2 and len(set(hung_pids)) == 2
    assert not any(_alive(p) for p in hung_pids)

    # The only worker slot is free again: this call is not queued behind a sleeping process.
    quick = wrappers(faulty_rewards.worker_pid, timeout_seconds=5, max_retries=0)
    pid = int(asyncio.run(quick()))
    assert pid not in hung_pids and _alive(pid)


@pytest.mark.slow  # worker processes crash, hang or restart
def test_cancelled_call_does_not_leave_its_job_running(wrappers, tmp_path):
    log = tmp_path / "hung.txt"
    hanging = wrappers(faulty_rewards.log_pid_then_hang, timeout_seconds=60, max_retries=0)
    quick = wrappers(faulty_rewards.worker_pid, timeout_seconds=5, max_retries=0)

    async def run():
        task = asyncio.create_task(hanging(str(log)))
        while not log.exists() or not log.read_text():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return int(await quick())

    fresh_pid = asyncio.run(run())
    hung_pid = int(log.read_text())
    assert not _alive(hung_pid)
    assert fresh_pid != hung_pid


@pytest.mark.slow  # worker processes crash, hang or restart
def test_hang_returns_zero_when_asked(wrappers, tmp_path):
    w = wrappers(faulty_rewards.log_pid_then_hang, timeout_seconds=0.5, max_retries=0, on_timeout="zero")
    assert asyncio.run(w(str(tmp_path / "hung.txt"))) == 0.0


def test_raising_reward_function_is_retried_then_reported(wrappers, tmp_path):
    log = tmp_path / "raised.txt"
    w = wrappers(faulty_rewards.log_then_raise, timeout_seconds=30, max_retries=2)
    with pytest.raises(RewardFunctionError, match="bad completion format") as info:
        asyncio.run(w(str(log)))
    assert isinstance(info.value.__cause__, ValueError)
    assert log.read_text() == "x\nx\nx\n"


def test_close_leaves_no_child_processes():
    a = AsyncRewardWrapper(faulty_rewards.worker_pid, max_workers=2)
    b = AsyncRewardWrapper(faulty_rewards.worker_pid, max_workers=2)  # shares a's pool

    async def run():
        return await asyncio.gather(*(w() for w in (a, b, a, b)))

    pids = {int(p) for p in asyncio.run(run())}
    assert pids <= _pool_pids()
    a.close()
    assert all(_alive(p) for p in pids)  # b still holds the shared pool
    b.close()
    assert not any(_alive(p) for p in pids)
    assert _pool_pids() == set()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(a())


def test_function_closing_over_a_lock_is_refused_naming_it():
    lock = threading.Lock()
    with pytest.raises(
        NotSerializableError, match=r"reward function '.*<lambda>'.*closure variable 'lock' \(lock\)"
    ):
        AsyncRewardWrapper(lambda **kw: 1.0 if lock else 0.0)


def test_a_lambda_closure_travels_by_value():
    bonus = 0.25
    with AsyncRewardWrapper(lambda x: x + bonus, max_workers=1) as reward:
        assert asyncio.run(reward(1.0)) == 1.25


MAIN_SCRIPT = """
import asyncio, os
from areal_nb.reward import AsyncRewardWrapper

SCALE = 2.0  # a global of __main__: travels with the function

def sync_reward(completion, answer):
    return SCALE * float(completion.strip() == answer)

async def async_reward(completion, answer):
    await asyncio.sleep(0)
    return float(answer in completion) + 0.5

class Pid:
    def __call__(self, **_):
        return float(os.getpid())

async def main():
    with AsyncRewardWrapper(sync_reward, max_workers=1) as s, AsyncRewardWrapper(async_reward, max_workers=1) as a:
        print(await s("7", "7"), await s("8", "7"), await a("is 7", "7"), await a("no", "7"))
        print(await s(completion=" 7 ", answer="7"), (await AsyncRewardWrapper(Pid(), max_workers=1)()) != os.getpid())

if __name__ == "__main__":  # spawn re-imports a script's main module (a notebook has none)
    asyncio.run(main())
"""


@pytest.mark.slow  # worker processes crash, hang or restart
def test_reward_functions_defined_in_main_run_in_workers(tmp_path):
    """Functions of a script run as `__main__` (as a notebook cell's are) cannot be imported
    by a spawned worker; they travel by value. Sync and async both."""
    script = tmp_path / "cell_like.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["2.0 0.0 1.5 0.5", "2.0 True"]


@pytest.mark.parametrize(
    "kw", [{"timeout_seconds": 0}, {"max_retries": -1}, {"max_workers": 0}, {"on_timeout": "ignore"}]
)
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        AsyncRewardWrapper(gsm8k_reward_fn, **kw)

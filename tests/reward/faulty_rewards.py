"""Reward functions that misbehave, for the AsyncRewardWrapper tests.

They live in their own module (put on sys.path by the tests) because spawned worker
processes import a reward function by module name.
"""

import os
import time


def worker_pid(**_: object) -> float:
    return float(os.getpid())


def log_pid_then_crash(log_path: str) -> float:
    with open(log_path, "a") as f:
        f.write(f"{os.getpid()}\n")
    os._exit(13)


def crash_first_time(marker_path: str) -> float:
    if not os.path.exists(marker_path):
        open(marker_path, "w").close()
        os._exit(13)
    return 1.0


def log_pid_then_hang(log_path: str) -> float:
    with open(log_path, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(3600)
    return 1.0


def log_then_raise(log_path: str) -> float:
    with open(log_path, "a") as f:
        f.write("x\n")
    raise ValueError("bad completion format")

"""A single-turn `verifiers` taskset: one sum per task, one reply, 1.0 when the reply's last
number is the sum."""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf
from vf_chat import ChatHarness

N_TASKS = 24


class SumData(vf.TaskData):
    answer: int


def last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace) -> float:
        return float(last_number(trace.last_reply) == self.data.answer)


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        rng = random.Random(0)
        for _ in range(N_TASKS):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            yield SumTask(SumData(prompt=f"What is {a} + {b}?", answer=a + b), self.config.task)


class SumHarness(ChatHarness):
    pass


__all__ = ["SumHarness", "SumTaskset"]

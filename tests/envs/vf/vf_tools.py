"""A tool-using `verifiers` environment: multiply two 2-digit numbers with a `calculator` tool the
harness runs; 1.0 when the final reply's last number is the product."""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf
from vf_chat import ChatHarness
from vf_single_turn import SumData, last_number

N_TASKS = 24
CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}


def calculator(expression: str) -> str:
    match = re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", expression)
    if not match:
        return "error: write the product as a*b"
    return str(int(match[1]) * int(match[2]))


class ProductTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace) -> float:
        return float(last_number(trace.last_reply) == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace) -> float:
        return float(len(trace.tool_messages))


class ProductTaskset(vf.Taskset[ProductTask]):
    def load(self):
        rng = random.Random(2)
        for _ in range(N_TASKS):
            a, b = rng.randint(11, 99), rng.randint(11, 99)
            yield ProductTask(SumData(prompt=f"What is {a} times {b}?", answer=a * b), self.config.task)


class CalculatorHarness(ChatHarness):
    TOOLS = {"calculator": (CALCULATOR, calculator)}


__all__ = ["CalculatorHarness", "ProductTaskset"]

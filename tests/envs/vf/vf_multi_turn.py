"""A multi-turn `verifiers` environment: the environment plays the user, and a wrong first reply
is answered "That is not right. Try again." (one more turn); the task's reward reads the last
reply."""

from __future__ import annotations

import random

import verifiers.v1 as vf
from vf_chat import ChatHarness
from vf_single_turn import SumData, SumTask, last_number

N_TASKS = 24
RETRY = "That is not right. Try again."


class RetryTaskset(vf.Taskset[SumTask]):
    def load(self):
        rng = random.Random(1)
        for _ in range(N_TASKS):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            yield SumTask(SumData(prompt=f"What is {a} + {b}?", answer=a + b), self.config.task)


class RetryEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class RetryEnv(vf.Env[RetryEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            if last_number(segment.last_reply) != task.data.answer:
                await chat.turn(RETRY)


class RetryHarness(ChatHarness):
    pass


__all__ = ["RetryEnv", "RetryHarness", "RetryTaskset"]

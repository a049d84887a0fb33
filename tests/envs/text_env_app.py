"""A small OpenEnv text environment for the tests: "What is a + b?", two tries.

Served with OpenEnv's own `create_app` (`uvicorn text_env_app:app`). The reset takes the task
row's `a` and `b`; a step takes `{"message": reply}` and pays 1.0 when the reply's last integer
is a + b. The episode ends at a right answer or after the second try.
"""

from __future__ import annotations

import re

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_TRIES = 2
QUOTE = "You said: "


class ReplyAction(Action):
    message: str


class TextObservation(Observation):
    prompt: str = ""


def score(reply: str, answer: int) -> float:
    """1.0 when the reply's last integer is the answer (the same rule the tests recompute)."""
    numbers = re.findall(r"-?\d+", reply)
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


class SumEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.answer = 0

    def reset(self, seed=None, episode_id=None, a: int = 1, b: int = 2, **kwargs) -> TextObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.answer = int(a) + int(b)
        return TextObservation(prompt=f"What is {a} + {b}? Answer with the number.", done=False, reward=None)

    def step(self, action: ReplyAction, timeout_s=None, **kwargs) -> TextObservation:
        self._state.step_count += 1
        reward = score(action.message, self.answer)
        done = reward > 0 or self._state.step_count >= MAX_TRIES
        # The reply quoted back: the tests compare it with the tokens the proxy recorded.
        return TextObservation(
            prompt=f"{QUOTE}{action.message}\nThat is not right. Try again.", done=done, reward=reward
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(SumEnvironment, ReplyAction, TextObservation, env_name="sum", max_concurrent_envs=64)

"""AReaL's multi-turn math agent as a proxy agent: answer, check, and retry once corrected.

Plain OpenAI SDK code: nothing here knows about tokens, log-probs or the trainer. Each turn's
completion gets its own reward (1.0 correct, 0.0 wrong); the episode stops at the first
correct answer or after `max_turns`. Sampling (temperature, token budget) is left to the server
unless given here: behind a Session's proxy that is the config's `rollout.temperature`,
`rollout.top_p` and `rollout.max_new_tokens`, and greedy during `evaluate()`.
"""

from __future__ import annotations

from typing import Any

from areal_nb.data import CORRECTION_PROMPT
from areal_nb.reward import AsyncRewardWrapper, math_reward

from .sdk_agent import SDKAgent, openai_client

_SCORE_MEMO_SIZE = 65536  # (reply, gold) pairs whose reward an agent keeps


class MultiTurnMathAgent(SDKAgent):
    def __init__(
        self,
        max_turns: int = 2,
        model: str = "default",
        temperature: float | None = None,  # None: the server's default
        max_completion_tokens: int | None = None,
        reward_timeout: float = 15.0,
    ) -> None:
        super().__init__(max_turns, model, temperature, max_completion_tokens)
        self.reward_timeout = reward_timeout
        self._reward: AsyncRewardWrapper | None = None
        # (reply, gold) -> reward, in insertion order (the oldest goes first when full)
        self._scores: dict[tuple[str, str], float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The reward wrapper owns worker processes; a pickled copy (subproc mode) makes its own.
        state = dict(self.__dict__)
        state["_reward"] = None
        return state

    def close(self) -> None:
        """Stop the reward worker processes (the Session calls this on close); the next `run`
        starts new ones, so a closed agent can still be used."""
        reward, self._reward = self._reward, None
        if reward is not None:
            reward.close()

    def _reward_fn(self) -> AsyncRewardWrapper:
        if self._reward is None:
            self._reward = AsyncRewardWrapper(math_reward, timeout_seconds=self.reward_timeout)
        return self._reward

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        """Per-turn rewards by completion id: 1.0 for the correct answer, 0.0 for a wrong one."""

        async def score(reply: str) -> float:
            # `math_reward` is a pure function of the two strings, and a group's samples (and the
            # steps of a run) repeat their replies: ~200 calls a demo step hold ~65 distinct pairs,
            # ~50 not seen in earlier steps. Each call to the worker process is a round trip that
            # the reply's next turn waits for, queued behind the others (one worker on 2 cores),
            # so a pair is sent there once. Failures are not kept: the next call tries again.
            key = (reply, str(data["answer"]))
            if key not in self._scores:
                reward = await self._reward_fn()(reply, data["answer"])
                if len(self._scores) >= _SCORE_MEMO_SIZE:
                    del self._scores[next(iter(self._scores))]
                self._scores[key] = reward
            return self._scores[key]

        return await self.answer_until_rewarded(
            openai_client(**extra_kwargs), list(data["messages"]), score, CORRECTION_PROMPT
        )

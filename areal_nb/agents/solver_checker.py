"""Two agents in one episode on the math task: a solver answers, a checker checks the answer.

Plain OpenAI SDK code. Each agent names itself in the `model` field of its calls ("solver",
"checker"), which is how the proxy tags every call with its agent: each agent's calls form their
own conversation tree, and the trainer's baselines are per (prompt, agent), so the solver's
rewards are compared with other solvers' and the checker's with other checkers'. One policy plays
both parts (the same weights answer both names).

- The solver gets the problem and answers; reward 1.0 when its answer is right, else 0.0.
- The checker gets the problem and the solver's answer, solves it itself and gives its final
  number (`\\boxed{n}` or `#### n`): it agrees with the solver when the final numbers are equal.
  Reward 1.0 for a right verdict (catching a wrong answer, or agreeing with a right one), 0.0
  for a wrong one (a missed error or a false alarm) and for a reply without a final number, so
  neither always disagreeing nor answering nothing pays.
"""

from __future__ import annotations

import re
from typing import Any

from areal_nb.errors import InvalidArgumentError
from areal_nb.reward import AsyncRewardWrapper, math_reward

from .sdk_agent import SDKAgent, openai_client

_CHECKER_PROMPT = (
    "Problem: {question}\n"
    "Proposed answer: {answer}\n"
    "Check the proposed answer: solve the problem yourself and give your final answer."
)
# A final answer as the math task writes it: `\boxed{n}` (the built-in model's replies) or `#### n` (GSM8K's)
_FINAL_NUMBER = re.compile(r"\\boxed\{\s*(-?[\d,]*\.?\d+)\s*\}|####\s*(-?[\d,]*\.?\d+)")


def final_number(text: str | None) -> float | None:
    """The last final answer of a reply, `\\boxed{n}` or `#### n` (None: there is none)."""
    found = _FINAL_NUMBER.findall(text or "")
    if not found:
        return None
    boxed, hashed = found[-1]
    try:
        return float((boxed or hashed).replace(",", ""))
    except ValueError:
        return None


def checker_reward(solver_correct: bool, solver_reply: str, checker_reply: str) -> float:
    """1.0 when the checker's verdict is right: it agrees with the solver (its final number
    equals the solver's) exactly when the solver is right. No final number: no verdict, 0.0."""
    mine, theirs = final_number(checker_reply), final_number(solver_reply)
    if mine is None:
        return 0.0
    agrees = mine == theirs
    return 1.0 if agrees == solver_correct else 0.0


class SolverCheckerAgent(SDKAgent):
    def __init__(
        self,
        solver: str = "solver",
        checker: str = "checker",
        temperature: float | None = None,  # None: the server's default (rollout.temperature)
        max_completion_tokens: int | None = None,  # None: rollout.max_new_tokens
        reward_timeout: float = 15.0,
    ) -> None:
        if solver == checker:
            raise InvalidArgumentError(
                f"the solver and the checker need different names, got {solver!r} for both"
            )
        super().__init__(1, solver, temperature, max_completion_tokens)
        self.solver, self.checker = solver, checker
        self.reward_timeout = reward_timeout
        self._reward: AsyncRewardWrapper | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The reward wrapper owns worker processes; a pickled copy (subproc mode) makes its own.
        state = dict(self.__dict__)
        state["_reward"] = None
        return state

    def close(self) -> None:
        """Stop the reward worker processes (the Session calls this on close)."""
        reward, self._reward = self._reward, None
        if reward is not None:
            reward.close()

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        """Both calls' rewards by completion id: the solver's for its answer, the checker's for its verdict."""
        if self._reward is None:
            self._reward = AsyncRewardWrapper(math_reward, timeout_seconds=self.reward_timeout)
        client = openai_client(**extra_kwargs)
        messages = list(data["messages"])
        solved = await self.chat(client, messages, model=self.solver)
        answer = solved.choices[0].message.content or ""
        solver_reward = await self._reward(answer, data["answer"])

        question = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        prompt = _CHECKER_PROMPT.format(question=question, answer=answer)
        checked = await self.chat(client, [{"role": "user", "content": prompt}], model=self.checker)
        verdict = checked.choices[0].message.content or ""
        return {
            solved.id: solver_reward,
            checked.id: checker_reward(solver_reward > 0, answer, verdict),
        }

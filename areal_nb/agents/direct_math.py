"""AReaL's multi-turn math workflow on the direct `ArealOpenAI` client (legacy path).

As AReaL's `MultiturnRLVRWorkflow`: one `ArealOpenAI` client per episode bound to the engine,
answer → math-verify reward → on a wrong answer the fixed correction prompt and one more try,
per-turn rewards, `apply_reward_discount(0.9)` and export. New code should prefer the proxy
agent in `math_agent.py`, which needs no areal_nb imports at all.

`tokenizer` may be a name or path ("tiny-math", a Hugging Face id), so a config can say
`workflow_kwargs: {tokenizer: tiny-math, ...}`.
"""

from __future__ import annotations

from typing import Any, Literal

from areal_nb.api import DiscountMode, ExportStyle, InferenceEngine, RolloutWorkflow, check_export_style
from areal_nb.data import CORRECTION_PROMPT
from areal_nb.errors import InvalidArgumentError
from areal_nb.reward import AsyncRewardWrapper, math_reward


class MultiTurnMathWorkflow(RolloutWorkflow):
    def __init__(
        self,
        tokenizer: Any,
        max_turns: int = 2,
        export_style: ExportStyle = "concat",
        turn_discount: float = 0.9,
        discount_mode: DiscountMode = "tree",
        temperature: float = 1.0,
        max_new_tokens: int = 16,
        reward_timeout: float = 15.0,
    ) -> None:
        check_export_style(export_style)
        if max_turns < 1:
            raise InvalidArgumentError(f"max_turns must be >= 1, got {max_turns}")
        if isinstance(tokenizer, str):
            from areal_nb.models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.export_style = export_style
        # concat rows need concat prompts; an individual export may still use them (the Session does)
        self.chat_template_type: Literal["hf", "concat"] = "concat"
        self.turn_discount = turn_discount
        self.discount_mode = discount_mode
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.reward_fn = AsyncRewardWrapper(math_reward, timeout_seconds=reward_timeout)

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]):
        from areal_nb.capture import ArealOpenAI

        client = ArealOpenAI(
            engine=engine, tokenizer=self.tokenizer, chat_template_type=self.chat_template_type
        )
        messages = list(data["messages"])  # never mutate the shared prompt: agents append to their input
        for _ in range(self.max_turns):
            completion = await client.chat.completions.create(
                messages=messages, temperature=self.temperature, max_completion_tokens=self.max_new_tokens
            )
            message = completion.choices[0].message
            messages.append(message)
            reward = await self.reward_fn(message.content or "", data["answer"])
            client.set_reward(completion.id, reward)
            if reward > 0:
                break
            messages.append({"role": "user", "content": CORRECTION_PROMPT})
        client.apply_reward_discount(turn_discount=self.turn_discount, mode=self.discount_mode)
        return client.export_interactions(style=self.export_style)

    def close(self) -> None:
        self.reward_fn.close()

"""Real captured episodes: LocalEngine("tiny-math") driven through ArealOpenAI, as agents do."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
CORRECTION = "Check your answer and give the final number after ####."


async def _two_turn_episode(
    engine, tokenizer, template: str, first_reward: float, last_reward: float, max_tokens: int = 8
):
    """Question → reply → correction → reply; rewards set per turn, nothing discounted yet."""
    from areal_nb.capture import ArealOpenAI

    client = ArealOpenAI(engine, tokenizer, chat_template_type=template)
    messages = [{"role": "user", "content": QUESTION}]
    first = await client.chat.completions.create(
        messages=messages, max_completion_tokens=max_tokens, temperature=1.0
    )
    client.set_reward(first.id, first_reward)
    messages = messages + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": CORRECTION},
    ]
    second = await client.chat.completions.create(
        messages=messages, max_completion_tokens=max_tokens, temperature=1.0
    )
    client.set_reward(second.id, last_reward)
    return client.cache


async def _branching_episode(engine, tokenizer, max_tokens: int = 6):
    """Two independent roots; the first root has two children (a branch): 4 calls, hf template."""
    from areal_nb.capture import ArealOpenAI

    client = ArealOpenAI(engine, tokenizer, chat_template_type="hf")
    root_a = await client.chat.completions.create(
        messages=[{"role": "user", "content": QUESTION}], max_completion_tokens=max_tokens
    )
    history = [{"role": "user", "content": QUESTION}, root_a.choices[0].message.model_dump(exclude_none=True)]
    for text in ("Try again.", CORRECTION):
        child = await client.chat.completions.create(
            messages=history + [{"role": "user", "content": text}], max_completion_tokens=max_tokens
        )
        client.set_reward(child.id, 1.0 if text == CORRECTION else 0.0)
    await client.chat.completions.create(
        messages=[{"role": "user", "content": "What is 2 + 2?"}], max_completion_tokens=max_tokens
    )
    return client.cache


def episode(cache, group_id: int = 0, sample_id: int = 0):
    from areal_nb.rollout.executor import Episode

    return Episode(
        data={"question": QUESTION},
        group_id=group_id,
        sample_id=sample_id,
        version_submitted=0,
        interactions=dict(cache),
    )


@pytest.fixture(scope="session")
def captured(local_engine, tiny_tokenizer):
    """Fresh caches (no discount applied): two concat episodes of one group and one branching hf one."""

    async def run():
        a = await _two_turn_episode(local_engine, tiny_tokenizer, "concat", 0.0, 1.0)
        b = await _two_turn_episode(local_engine, tiny_tokenizer, "concat", 0.5, 0.0)
        c = await _branching_episode(local_engine, tiny_tokenizer)
        return a, b, c

    a, b, c = asyncio.run(run())
    return SimpleNamespace(concat_a=a, concat_b=b, branching=c)

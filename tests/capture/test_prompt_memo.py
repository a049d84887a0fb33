"""The prompt memo: a repeated conversation is rendered once, and a hit always equals a fresh
render (the same ids as the tokenizer's template, for every input the memo accepts)."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest

from areal_nb.capture import ArealOpenAI, CompletionRequestError, render_prompt_ids
from areal_nb.capture.prompt_memo import MAX_KEY_BYTES, PromptMemo, prompt_memo
from areal_nb.testing import ScriptedEngine

USER = [{"role": "user", "content": "A bag holds 6 oranges. Liam takes 2 out. How many are left?"}]
TOOLS = [
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}
]


class CountingTokenizer:
    """The real tokenizer, with its renders counted; `chat_template` may be replaced on it."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.renders = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, conversation, **kwargs):
        self.renders += 1
        if "chat_template" in self.__dict__:
            kwargs["chat_template"] = self.__dict__["chat_template"]
        return self._tokenizer.apply_chat_template(conversation, **kwargs)


@pytest.fixture
def counting(tiny_tokenizer):
    return CountingTokenizer(tiny_tokenizer)


def fresh(tokenizer, messages, tools=None):
    return [
        int(t)
        for t in tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    ]


def test_a_repeated_conversation_is_rendered_once_with_the_same_ids(counting, tiny_tokenizer):
    first = render_prompt_ids(counting, USER)
    again = render_prompt_ids(counting, [dict(m) for m in USER])  # an equal, not identical, list
    assert first == again == fresh(tiny_tokenizer, USER)
    assert counting.renders == 1
    again.append(-1)  # the caller owns the list it gets: the memo keeps its own copy
    assert render_prompt_ids(counting, USER) == first
    assert (prompt_memo(counting).hits, prompt_memo(counting).misses) == (2, 1)


def test_what_the_template_reads_is_part_of_the_key(counting, tiny_tokenizer):
    render_prompt_ids(counting, USER)
    other = [{"role": "user", "content": USER[0]["content"] + " "}]
    assert render_prompt_ids(counting, other) == fresh(tiny_tokenizer, other)
    assert render_prompt_ids(counting, USER, TOOLS) == fresh(tiny_tokenizer, USER, TOOLS)
    assert render_prompt_ids(counting, USER, []) == fresh(tiny_tokenizer, USER)  # [] renders as no tools
    assert counting.renders == 3


def test_inputs_that_only_look_like_json_are_rendered_every_time(counting):
    class Role(str, enum.Enum):  # noqa: UP042 (a str subclass on purpose)  serialises as "user" but is not the plain string
        USER = "user"

    for messages in (
        [{"role": Role.USER, "content": "hi"}],
        [{"role": "user", "content": "hi", "x": float("nan")}],
        [{"role": "user", "content": "x" * MAX_KEY_BYTES}],
    ):
        render_prompt_ids(counting, messages)
        render_prompt_ids(counting, messages)
    assert counting.renders == 6


def test_a_new_chat_template_empties_the_memo(counting, tiny_tokenizer):
    before = render_prompt_ids(counting, USER)
    counting.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert render_prompt_ids(counting, USER) == tiny_tokenizer.encode(
        USER[0]["content"], add_special_tokens=False
    )
    assert render_prompt_ids(counting, USER) != before
    assert counting.renders == 2


def test_templates_that_read_the_clock_are_never_memoised(counting):
    counting.chat_template = (
        "{{ strftime_now('%H:%M:%S.%f') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    render_prompt_ids(counting, USER)
    render_prompt_ids(counting, USER)
    assert counting.renders == 2


def test_a_rejected_conversation_is_rejected_every_time(counting):
    counting.chat_template = "{{ raise_exception('no') }}"
    for _ in range(2):
        with pytest.raises(CompletionRequestError, match="rejected this conversation"):
            render_prompt_ids(counting, USER)
    assert counting.renders == 2


def test_the_memo_keeps_the_most_recent_entries():
    memo, renders = PromptMemo(max_entries=2), []

    def ids_of(text: str) -> list[int]:
        return memo.ids("template", ([{"content": text}],), lambda: renders.append(text) or [len(renders)])

    assert [ids_of("a"), ids_of("b"), ids_of("a"), ids_of("c"), ids_of("a"), ids_of("b")] == [
        [1],
        [2],
        [1],
        [3],
        [1],
        [4],
    ]
    assert renders == ["a", "b", "c", "b"]  # "b" was the least recently used when "c" came


def test_a_grpo_group_renders_its_prompt_once_and_every_sample_gets_the_exact_prompt(
    counting, tiny_tokenizer
):
    engine = ScriptedEngine(counting, "The answer is 4")
    client = ArealOpenAI(engine, counting, chat_template_type="hf")

    async def group() -> list[Any]:
        return await asyncio.gather(
            *(client.chat.completions.create(messages=USER, max_completion_tokens=8) for _ in range(8))
        )

    completions = asyncio.run(group())
    assert counting.renders == 1
    prompts = [client.get_interaction(c.id).model_response.input_tokens for c in completions]
    assert prompts == [fresh(tiny_tokenizer, USER)] * 8

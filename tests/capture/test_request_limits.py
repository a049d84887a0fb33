"""`request_limits`: the prompt-size bound is sound, and template variables are what templates read."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_nb.capture.completion import CompletionRequestError
from areal_nb.capture.request_limits import (
    check_chat_template_kwargs,
    check_prompt_size,
    max_chars_per_token,
    template_variables,
    text_chars,
)
from areal_nb.capture.templates import render_prompt_ids


def test_no_token_stands_for_more_text_than_the_bound(tiny_tokenizer):
    bound = max_chars_per_token(tiny_tokenizer)
    assert bound == 16
    assert all(
        len(tiny_tokenizer.decode([i], skip_special_tokens=False)) <= bound
        for i in tiny_tokenizer.get_vocab().values()
    )


@given(st.text(st.characters(codec="utf-8"), max_size=3000))
@settings(max_examples=40, deadline=None)
def test_a_prompt_refused_for_its_size_would_not_have_fit(tiny_tokenizer, text):
    messages = [{"role": "user", "content": text}]
    try:
        check_prompt_size(messages, None, tiny_tokenizer, context=64)
    except CompletionRequestError:
        assert len(render_prompt_ids(tiny_tokenizer, messages)) >= 64  # sound: never refuses what fits


def test_text_chars_counts_every_string_without_recursion():
    deep: object = "abc"
    for _ in range(50_000):
        deep = [deep]
    assert text_chars({"k": deep, "n": 3, "s": "xy"}) == len("kabcnsxy")


def test_template_variables_exclude_renderer_and_assigned_names(tiny_tokenizer):
    assert template_variables(tiny_tokenizer) == frozenset()  # tiny-math's template reads none
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% set x = 1 %}{{ x }}{% if enable_thinking %}T{% endif %}{{ bos_token }}"
        + tiny_tokenizer.chat_template
    )
    assert template_variables(tokenizer) == frozenset({"enable_thinking"})
    assert check_chat_template_kwargs({"enable_thinking": False}, tokenizer) == {"enable_thinking": False}
    with pytest.raises(
        CompletionRequestError,
        match=r"\['chat_template', 'tokenize'\] .* allowed keys: \['enable_thinking'\]",
    ):
        check_chat_template_kwargs({"tokenize": False, "chat_template": "{{ 'x' }}"}, tokenizer)

"""`context_refusal` reads the words SGLang's tokenizer manager (0.5.x) and `areal-nb
engine-server` refuse an over-long prompt with: the server's limit from its message, else the
engine's `max_context`; a prompt that fits but asked too many new tokens is no overflow."""

from __future__ import annotations

import pytest

from areal_nb.engine.sglang_client.transport import context_refusal

SGLANG_INPUT = "The input (600 tokens) is longer than the model's context length (512 tokens)."
SGLANG_TOTAL = (
    "Requested token count exceeds the model's maximum context length of 512 tokens. You requested a total "
    "of 700 tokens: 600 tokens from the input messages and 100 tokens for the completion. Please reduce "
    "the number of tokens in the input messages or the completion to fit within the limit."
)
ENGINE_SERVER = (
    "Requested token count exceeds the model's maximum context length of 512 tokens: "
    "600 prompt tokens + max_new_tokens=4"
)


@pytest.mark.parametrize("message", [SGLANG_INPUT, SGLANG_TOTAL, ENGINE_SERVER])
def test_a_servers_context_refusal_of_a_prompt_is_an_overflow(message):
    overflow = context_refusal(message, 600, max_context=None)
    assert overflow is not None and (overflow.tokens, overflow.context) == (600, 512)
    assert overflow.code == "context_length_exceeded" and overflow.detail.endswith(message)


def test_the_limit_comes_from_max_context_when_the_message_has_none():
    overflow = context_refusal("the input is longer than the model's context length", 600, max_context=300)
    assert overflow is not None and overflow.context == 300
    assert (
        context_refusal("the input is longer than the model's context length", 600, max_context=None) is None
    )


def test_other_refusals_stay_engine_refusals():
    assert context_refusal(ENGINE_SERVER.replace("600 prompt", "3 prompt"), 3, max_context=None) is None
    assert context_refusal("sampling_params.n must be 1: send n separate requests", 600, 512) is None

"""The old home of the completion logic, kept as an import path.

The logic now lives in one module per job: `settings.py` (`CompletionSettings`, the token budget
and sampling rules), `generate.py` (the core every door shares: prompt, parent, budget,
generation, record) and `chat.py` (the chat-completions door). Code and notebooks that import
`areal_nb.capture.completion` (or `areal_nb.openai.completion`) get the same objects from here.
"""

from __future__ import annotations

from .chat import chat_completion_stream_chunks, chat_prompt_ids, create_chat_completion, sampled_logprobs
from .generate import (
    INLINE_RENDER_CHARS,
    MAX_CHOICES,
    MODEL_NAME,
    build_prompt_ids,
    check_not_aborted,
    cut_stop_string,
    decode_output,
    generate_for_messages,
)
from .messages import CompletionRequestError, MessageTypeError
from .settings import CompletionSettings, TokenBudget, resolve_token_budget, sampling_config

__all__ = [
    "INLINE_RENDER_CHARS",
    "MAX_CHOICES",
    "MODEL_NAME",
    "CompletionRequestError",
    "CompletionSettings",
    "MessageTypeError",
    "TokenBudget",
    "build_prompt_ids",
    "chat_completion_stream_chunks",
    "chat_prompt_ids",
    "check_not_aborted",
    "create_chat_completion",
    "cut_stop_string",
    "decode_output",
    "generate_for_messages",
    "resolve_token_budget",
    "sampled_logprobs",
    "sampling_config",
]

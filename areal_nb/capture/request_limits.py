"""Limits checked before any heavy work: prompt size, message count, chat-template variables.

A prompt's size is bounded *before* tokenizing: no token covers more than `max_chars_per_token`
characters, so a conversation whose text holds more than `context × max_chars_per_token`
characters can never fit the model's context, and is rejected without rendering it.

`chat_template_kwargs` reach `apply_chat_template`, whose keyword arguments also replace the
template (`chat_template`), truncate the prompt (`truncation`, `max_length`) or change what comes
back (`tokenize`, `return_dict`). Only the variables the model's own template reads are
accepted (found with `jinja2.meta.find_undeclared_variables`), minus those the renderer fills in.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal_nb.errors import ContextLengthExceeded

from .messages import CompletionRequestError

if TYPE_CHECKING:
    from areal_nb.api import InferenceEngine

# Filled in by transformers' renderer or jinja itself, never by a request.
_RENDERER_VARIABLES = frozenset(
    {
        "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
        "raise_exception", "strftime_now", "range", "namespace", "dict", "lipsum", "cycler", "joiner",
        "bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
        "additional_special_tokens", "chat_template", "tokenize", "truncation", "max_length", "padding",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip

_cache_lock = threading.Lock()
_chars_per_token: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_template_variables: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def context_tokens(engine: InferenceEngine, engine_max_tokens: int | None) -> int | None:
    """The most prompt + output tokens one call can use: the engine's context or the setting."""
    limits = [x for x in (engine.max_context, engine_max_tokens) if isinstance(x, int) and x > 0]
    return min(limits) if limits else None


def max_chars_per_token(tokenizer: Any) -> int:
    """An upper bound on the text one token of `tokenizer` stands for: its longest vocabulary
    entry. A token's text is never longer than its vocabulary string (byte-level BPE maps one
    byte to one character, SentencePiece's `▁` is one space, `<0x0A>` is one byte), so the bound
    is sound and costs one pass over the vocabulary, not a decode per token."""
    with _cache_lock:
        cached = _chars_per_token.get(tokenizer)
    if cached is not None:
        return cached
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    with _cache_lock:
        _chars_per_token[tokenizer] = longest
    return longest


def text_chars(*values: Any) -> int:
    """Total length of every string (keys included) inside nested dicts/lists; no recursion."""
    total, stack = 0, list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return total


def check_prompt_size(messages: list[Any], tools: Any, tokenizer: Any, context: int | None) -> None:
    """Reject conversations that surely exceed `context` tokens, before rendering them
    (`ContextLengthExceeded` with a lower bound on their tokens)."""
    if context is None:
        return
    if len(messages) >= context:  # every message renders to at least one token
        raise ContextLengthExceeded(
            len(messages),
            context,
            at_least=True,
            detail=(
                f"{len(messages)} messages cannot fit the model context of {context} tokens "
                f"(at most {context - 1} messages)"
            ),
        )
    per_token = max_chars_per_token(tokenizer)
    limit = (context - 1) * per_token
    chars = text_chars(messages, tools)
    if chars > limit:
        raise ContextLengthExceeded(
            -(-chars // per_token),  # no token covers more than `per_token` characters
            context,
            at_least=True,
            detail=(
                f"its messages and tools hold {chars} characters, more than the {limit} characters "
                f"that could fit the model context of {context} tokens"
            ),
        )


def check_prompt_tokens(prompt_len: int, context: int | None) -> None:
    """Reject a rendered prompt that leaves no room for one output token in `context`."""
    if context is not None and prompt_len >= context:
        raise ContextLengthExceeded(
            prompt_len,
            context,
            detail=f"at most {context - 1} prompt tokens leave room for one output token",
        )


def check_max_tokens(budget_kwargs: Mapping[str, Any], context: int | None) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        value = budget_kwargs.get(name)
        if context is not None and isinstance(value, int) and value > context:
            raise CompletionRequestError(
                f"{name}={value} is larger than the model context of {context} tokens"
            )


def template_variables(tokenizer: Any) -> frozenset[str]:
    """The variables of `tokenizer`'s chat template a request may set."""
    with _cache_lock:
        cached = _template_variables.get(tokenizer)
    if cached is not None:
        return cached
    from jinja2 import TemplateSyntaxError, meta, nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    template = getattr(tokenizer, "chat_template", None)
    sources = list(template.values()) if isinstance(template, Mapping) else [template]
    found: set[str] = set()
    for source in sources:
        if isinstance(source, str):
            try:
                ast = env.parse(source)
            except TemplateSyntaxError:
                continue  # a template we cannot parse accepts no extra variables
            # a name the template sets itself is read in an inner scope, not taken from the caller
            assigned = {n.name for node in ast.find_all(nodes.Assign) for n in node.find_all(nodes.Name)}
            found |= meta.find_undeclared_variables(ast) - assigned
    special = set(getattr(tokenizer, "special_tokens_map", {}) or {})
    options = set(inspect.signature(tokenizer.apply_chat_template).parameters)
    allowed = frozenset(found - _RENDERER_VARIABLES - special - options)
    with _cache_lock:
        _template_variables[tokenizer] = allowed
    return allowed


def check_chat_template_kwargs(kwargs: Mapping[str, Any] | None, tokenizer: Any) -> dict[str, Any] | None:
    """`kwargs` if every key is a variable of the model's template; CompletionRequestError otherwise."""
    if not kwargs:
        return None
    allowed = template_variables(tokenizer)
    unknown = sorted(str(k) for k in kwargs if k not in allowed)
    if unknown:
        raise CompletionRequestError(
            f"chat_template_kwargs {unknown} are not variables of this model's chat template; "
            f"allowed keys: {sorted(allowed) or 'none'}"
        )
    return dict(kwargs)

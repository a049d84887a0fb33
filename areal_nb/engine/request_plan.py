"""Validation of a `ModelRequest` into the exact plan the scheduler runs.

All bad input is rejected here, in the caller's thread, before anything reaches the worker:
a bad request raises `InvalidRequestError` (a `ValueError`) naming the problem and never
disturbs other requests.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from areal_nb.api import GenerationConfig, InvalidRequestError, ModelRequest, OutputConstraint

from .sampling import SamplingParams


@dataclass(frozen=True)
class RequestPlan:
    rid: str
    prompt: list[int]
    max_new_tokens: int  # already capped by max_tokens and the model context
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    min_new_tokens: int
    sampling: SamplingParams
    constraint: OutputConstraint | None = None  # structured output: sample only what it allows


def _check_prompt(prompt: list[int], g: GenerationConfig, vocab_size: int, max_context: int) -> None:
    """InvalidRequestError unless `prompt` is in the vocabulary and leaves room for an output token."""
    if not prompt:
        raise InvalidRequestError("empty prompt: input_ids must contain at least one token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"prompt has token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}")
    if len(prompt) >= max_context:
        raise InvalidRequestError(
            f"prompt of {len(prompt)} tokens is too long for the model context of {max_context} "
            f"tokens (at most {max_context - 1} prompt tokens leave room for one output token)"
        )
    if g.max_tokens - len(prompt) <= 0:
        raise InvalidRequestError(
            f"max_tokens={g.max_tokens} leaves no room to generate after a prompt of {len(prompt)} tokens"
        )


def _check_generation_config(g: GenerationConfig, vocab_size: int, tokenizer: Any) -> None:
    """InvalidRequestError for sampling settings this engine cannot honour (ranges, stop tokens
    outside the vocabulary, stop strings or structured output without a tokenizer)."""
    if not g.checked:  # a config from a door (capture layer, engine-server) was checked there
        g.check()  # sampling ranges, stop strings, unsupported penalties
    unknown_stops = [t for t in g.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if unknown_stops:
        raise InvalidRequestError(
            f"unknown stop token ids {unknown_stops}: the vocabulary is [0, {vocab_size})"
        )
    if g.stop and tokenizer is None:
        raise InvalidRequestError("stop strings need a tokenizer; this LocalEngine was built without one")
    if g.constraint is not None and tokenizer is None:
        raise InvalidRequestError(
            "structured output needs a tokenizer; this LocalEngine was built without one"
        )


def plan_request(
    req: ModelRequest,
    *,
    vocab_size: int,
    max_context: int,
    eos_token_ids: list[int],
    tokenizer: Any,
) -> RequestPlan:
    g = req.gconfig
    try:
        prompt = [operator.index(t) for t in req.input_ids]
    except TypeError as exc:
        raise InvalidRequestError(f"input_ids must be integer token ids: {exc}") from None
    if g.n_samples != 1:
        raise InvalidRequestError(
            f"LocalEngine generates one sample per request, got n_samples={g.n_samples}; "
            "send n_samples separate requests instead"
        )
    _check_prompt(prompt, g, vocab_size, max_context)
    _check_generation_config(g, vocab_size, tokenizer)
    stop_strings = tuple(g.stop or ())
    greedy = g.greedy or g.temperature == 0

    # "ignore_eos" means generate to the length limit: the model's EOS never ends a request.
    stop_ids = set(g.stop_token_ids)
    if g.ignore_eos:
        stop_ids -= set(eos_token_ids)
    else:
        stop_ids |= set(eos_token_ids)

    max_new = min(g.max_new_tokens, g.max_tokens - len(prompt), max_context - len(prompt))
    return RequestPlan(
        rid=req.rid,
        prompt=prompt,
        max_new_tokens=max_new,
        stop_token_ids=frozenset(stop_ids),
        stop_strings=stop_strings,
        min_new_tokens=g.min_new_tokens,
        sampling=SamplingParams(
            greedy=greedy,
            temperature=1.0 if greedy else float(g.temperature),
            top_p=float(g.top_p),
            top_k=int(g.top_k),
        ),
        constraint=g.constraint,
    )

"""The settings of the completion logic and the rules that turn a request into sampling.

`CompletionSettings` is what a client or a proxy fixes for all its calls (template type, parsers,
default sampling); `resolve_token_budget` and `sampling_config` apply the same rules to every
door's request (chat, Responses, Anthropic Messages, text completions), so a door converts its
request's fields (the sampling ones into a `SamplingRequest`) and leaves the checking here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from areal_nb.api import (
    CHAT_TEMPLATE_TYPES,
    ChatTemplateType,
    GenerationConfig,
    InvalidRequestError,
    OutputConstraint,
)
from areal_nb.api.io_struct import with_pad_and_eos_ids
from areal_nb.errors import ContextLengthExceeded, InvalidArgumentError

from .messages import CompletionRequestError
from .tool_calls import SUPPORTED_REASONING_PARSERS, SUPPORTED_TOOL_CALL_PARSERS

__all__ = [
    "CompletionSettings",
    "SamplingRequest",
    "TokenBudget",
    "check_positive_int",
    "resolve_token_budget",
    "sampling_config",
]


@dataclass
class CompletionSettings:
    """Per-client (or per-proxy) settings of the completion logic."""

    chat_template_type: ChatTemplateType = "hf"
    engine_max_tokens: int | None = None  # cap on prompt + output tokens
    tool_call_parser: str = "qwen"
    reasoning_parser: str = "qwen3"
    # Used when a request leaves them out, so a server can set its agents' sampling (the Session
    # serves its rollout.temperature / top_p / max_new_tokens). default_max_new_tokens=None:
    # 512 with a warning, since nobody chose the budget.
    default_temperature: float = 1.0
    default_top_p: float = 1.0
    default_max_new_tokens: int | None = None
    # A server refuses a generation the engine aborted (GenerationAborted: 503, nothing recorded)
    # rather than answer a cut reply as complete; `ArealOpenAI` returns it whole, as AReaL does.
    refuse_aborted: bool = True

    def __post_init__(self) -> None:
        if self.chat_template_type not in CHAT_TEMPLATE_TYPES:
            raise InvalidArgumentError(
                f"chat_template_type must be one of {CHAT_TEMPLATE_TYPES}, got {self.chat_template_type!r}"
            )
        if self.tool_call_parser not in SUPPORTED_TOOL_CALL_PARSERS:
            raise InvalidArgumentError(
                f"tool_call_parser must be one of {SUPPORTED_TOOL_CALL_PARSERS}, got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser not in SUPPORTED_REASONING_PARSERS:
            raise InvalidArgumentError(
                f"reasoning_parser must be one of {SUPPORTED_REASONING_PARSERS}, got {self.reasoning_parser!r}"
            )
        if self.engine_max_tokens is not None:
            check_positive_int("engine_max_tokens", self.engine_max_tokens, InvalidArgumentError)
        if self.default_max_new_tokens is not None:
            check_positive_int("default_max_new_tokens", self.default_max_new_tokens, InvalidArgumentError)
        try:  # the same ranges as a request's (one rule: GenerationConfig.check)
            GenerationConfig(
                greedy=self.default_temperature == 0,
                temperature=self.default_temperature,
                top_p=self.default_top_p,
            ).check()
        except InvalidRequestError as exc:
            raise InvalidArgumentError(f"default_temperature / default_top_p: {exc}") from None

    def fill_sampling(self, request: SamplingRequest) -> SamplingRequest:
        """The request with these settings' temperature and top_p where it has none."""
        return replace(
            request,
            temperature=self.default_temperature if request.temperature is None else request.temperature,
            top_p=self.default_top_p if request.top_p is None else request.top_p,
        )


def check_positive_int(name: str, value: Any, error: type[Exception] = CompletionRequestError) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an integer, got {value!r}")
    if value <= 0:
        raise error(f"{name} must be positive, got {value}")
    return value


@dataclass
class TokenBudget:
    max_new_tokens: int
    max_total_tokens: int  # prompt + output cap handed to the engine


def resolve_token_budget(
    prompt_len: int,
    *,
    max_tokens: int | None = None,
    max_completion_tokens: int | None = None,
    max_total_tokens: int | None = None,
    engine_max_tokens: int | None = None,
    default_max_new_tokens: int | None = None,
) -> TokenBudget:
    """The token budget rules (docs/reference/areal-semantics.md, "Chat completions")."""
    if max_tokens is not None and max_completion_tokens is not None:
        raise CompletionRequestError(
            "max_tokens and max_completion_tokens cannot be set at the same time. "
            "max_tokens has been deprecated; use max_completion_tokens instead."
        )
    if max_tokens is None and max_completion_tokens is None and default_max_new_tokens is not None:
        max_completion_tokens = default_max_new_tokens  # the server's choice stands in for the request's
    if max_tokens is not None:
        max_completion_tokens = check_positive_int("max_tokens", max_tokens)
    elif max_completion_tokens is not None:
        check_positive_int("max_completion_tokens", max_completion_tokens)
    if max_total_tokens is not None:
        check_positive_int("max_total_tokens", max_total_tokens)
    limits = {
        k: v
        for k, v in (("max_total_tokens", max_total_tokens), ("engine_max_tokens", engine_max_tokens))
        if v is not None
    }
    max_new: int | None = None
    total: int | None = None
    if limits:
        name = min(limits, key=lambda key: limits[key])
        total = limits[name]
        max_new = total - prompt_len
        if max_new <= 0:
            detail = f"len of prompt tokens {prompt_len} exceeds {name} {total}"  # AReaL's words
            if name == "engine_max_tokens":  # the server's cap: the conversation outgrew the model
                raise ContextLengthExceeded(prompt_len, total, detail=detail)
            raise CompletionRequestError(detail)  # the request's own cap
    if max_completion_tokens is not None:
        max_new = max_completion_tokens if max_new is None else min(max_new, max_completion_tokens)
    if max_new is None:
        max_new = 512
        warnings.warn(
            f"no max_tokens, max_completion_tokens or max_total_tokens given; generating at most {max_new} tokens",
            stacklevel=3,
        )
    return TokenBudget(
        max_new_tokens=max_new, max_total_tokens=prompt_len + max_new if total is None else total
    )


@dataclass(frozen=True)
class SamplingRequest:
    """A request's sampling fields as it sent them (None: left out), before any is checked."""

    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    stop: Any = None
    presence_penalty: float | None = None
    top_k: int | None = None
    constraint: OutputConstraint | None = None


def sampling_config(request: SamplingRequest, *, tokenizer: Any, budget: TokenBudget) -> GenerationConfig:
    """The engine's `GenerationConfig`; ranges are checked by `GenerationConfig.check`.

    `tokenizer=None` checks the values only (no stop token ids): what the door check before
    rendering needs, without reading the tokenizer's special tokens twice per call."""
    if request.presence_penalty:
        raise CompletionRequestError(
            f"presence_penalty is not supported (got {request.presence_penalty}); send 0 or omit it"
        )
    temp = 1.0 if request.temperature is None else request.temperature
    top = 1.0 if request.top_p is None else request.top_p
    for name, value in (("temperature", temp), ("top_p", top)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CompletionRequestError(f"{name} must be a number, got {value!r:.80}")
    stop = request.stop
    if stop is None:
        stops = None
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop) or None
    else:
        raise CompletionRequestError(f"stop must be a string or a list of strings, got {stop!r:.80}")
    top_k_option: dict[str, Any] = {} if request.top_k is None else {"top_k": request.top_k}
    gconfig = GenerationConfig(
        n_samples=1,
        max_new_tokens=budget.max_new_tokens,
        max_tokens=budget.max_total_tokens,
        greedy=temp == 0.0,
        temperature=float(temp),
        top_p=float(top),
        **top_k_option,  # None: no top-k cut (GenerationConfig's default)
        stop=stops,
        frequency_penalty=float(request.frequency_penalty or 0.0),
        stop_token_ids=[] if tokenizer is None else with_pad_and_eos_ids((), tokenizer),
        constraint=request.constraint,
    )
    try:
        gconfig.check()
    except InvalidRequestError as exc:
        raise CompletionRequestError(str(exc)) from None
    return gconfig

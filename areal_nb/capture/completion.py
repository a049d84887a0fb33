"""Chat-completion logic shared by `ArealOpenAI` (direct mode) and the proxy.

`create_chat_completion` turns an OpenAI-style request into prompt ids (hf or concat template),
asks the engine, records the call in an `InteractionCache` and returns an OpenAI
`ChatCompletion`. Invalid requests raise `CompletionRequestError` (an `InvalidRequestError`, HTTP 400 in the
proxy) before anything is cached: sizes are checked before the template is rendered, and
rendering plus tokenizing run in a worker thread so a large prompt never blocks the event loop; a failing engine call removes its cache entry, so the cache never
holds an incomplete interaction because of an error.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

from areal_nb.api import (
    CHAT_TEMPLATE_TYPES,
    ChatTemplateType,
    GenerationConfig,
    InferenceEngine,
    InvalidRequestError,
    ModelRequest,
    ModelResponse,
    OutputConstraint,
)
from areal_nb.api.io_struct import with_pad_and_eos_ids
from areal_nb.errors import ContextLengthExceeded, GenerationAborted

from .cache import ConversationLinkWarning, InteractionCache
from .interaction import InteractionWithTokenLogpReward
from .messages import CompletionRequestError, MessageTypeError, check_chat_messages, normalize_messages
from .request_limits import (
    check_chat_template_kwargs,
    check_max_tokens,
    check_prompt_size,
    check_prompt_tokens,
    context_tokens,
    text_chars,
)
from .structured import (
    constraint_of_format,
    constraint_of_guided,
    constraint_of_tool_choice,
    request_constraint,
    with_format_instruction,
)
from .templates import concat_prompt_token_ids_with_parent, render_prompt_ids
from .tool_calls import (
    SUPPORTED_REASONING_PARSERS,
    SUPPORTED_TOOL_CALL_PARSERS,
    parse_tool_calls,
    tool_calls_to_openai,
)
from .tool_specs import check_tools

__all__ = [
    "CompletionRequestError",
    "CompletionSettings",
    "MessageTypeError",
    "TokenBudget",
    "chat_completion_stream_chunks",
    "create_chat_completion",
    "resolve_token_budget",
]

MODEL_NAME = "areal-nb"
# Conversations up to this many characters are rendered on the event loop, longer ones in a thread.
# Rendering + tokenizing costs ~0.5 us/char of prose and ~1.2 us/char of digits (tiny-math), so at
# 2 KiB the loop is held ~2.5 ms at most; at 16 KiB it was held up to 21 ms, and a hostile 6 KB
# over-context prompt held it 7 ms a time (tests/proxy/test_chaos.py's /health p99). A thread
# hop costs the loop ~0.03 ms, small next to rendering 2 KiB; tiny-math prompts stay inline.
INLINE_RENDER_CHARS = 2 * 1024


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
            raise ValueError(
                f"chat_template_type must be one of {CHAT_TEMPLATE_TYPES}, got {self.chat_template_type!r}"
            )
        if self.tool_call_parser not in SUPPORTED_TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {SUPPORTED_TOOL_CALL_PARSERS}, got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser not in SUPPORTED_REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {SUPPORTED_REASONING_PARSERS}, got {self.reasoning_parser!r}"
            )
        if self.engine_max_tokens is not None:
            _check_positive_int("engine_max_tokens", self.engine_max_tokens, ValueError)
        if self.default_max_new_tokens is not None:
            _check_positive_int("default_max_new_tokens", self.default_max_new_tokens, ValueError)
        try:  # the same ranges as a request's (one rule: GenerationConfig.check)
            GenerationConfig(
                greedy=self.default_temperature == 0,
                temperature=self.default_temperature,
                top_p=self.default_top_p,
            ).check()
        except InvalidRequestError as exc:
            raise ValueError(f"default_temperature / default_top_p: {exc}") from None

    def fill_sampling(self, temperature: float | None, top_p: float | None) -> tuple[float, float]:
        """The request's temperature and top_p, or these settings' defaults where it has none."""
        return (
            self.default_temperature if temperature is None else temperature,
            self.default_top_p if top_p is None else top_p,
        )


def _check_positive_int(name: str, value: Any, error: type[Exception] = CompletionRequestError) -> int:
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
        max_completion_tokens = _check_positive_int("max_tokens", max_tokens)
    elif max_completion_tokens is not None:
        _check_positive_int("max_completion_tokens", max_completion_tokens)
    if max_total_tokens is not None:
        _check_positive_int("max_total_tokens", max_total_tokens)
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


def sampling_config(
    *,
    temperature: float | None,
    top_p: float | None,
    frequency_penalty: float | None,
    stop: Any,
    tokenizer: Any,
    budget: TokenBudget,
    presence_penalty: float | None = None,
    top_k: int | None = None,
    constraint: OutputConstraint | None = None,
) -> GenerationConfig:
    """The engine's `GenerationConfig`; ranges are checked by `GenerationConfig.check`.

    `tokenizer=None` checks the values only (no stop token ids): what the door check before
    rendering needs, without reading the tokenizer's special tokens twice per call."""
    if presence_penalty:
        raise CompletionRequestError(
            f"presence_penalty is not supported (got {presence_penalty}); send 0 or omit it"
        )
    temp = 1.0 if temperature is None else temperature
    top = 1.0 if top_p is None else top_p
    for name, value in (("temperature", temp), ("top_p", top)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CompletionRequestError(f"{name} must be a number, got {value!r:.80}")
    if stop is None:
        stops = None
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop) or None
    else:
        raise CompletionRequestError(f"stop must be a string or a list of strings, got {stop!r:.80}")
    top_k_option: dict[str, Any] = {} if top_k is None else {"top_k": top_k}
    gconfig = GenerationConfig(
        n_samples=1,
        max_new_tokens=budget.max_new_tokens,
        max_tokens=budget.max_total_tokens,
        greedy=temp == 0.0,
        temperature=float(temp),
        top_p=float(top),
        **top_k_option,  # None: no top-k cut (GenerationConfig's default)
        stop=stops,
        frequency_penalty=float(frequency_penalty or 0.0),
        stop_token_ids=[] if tokenizer is None else with_pad_and_eos_ids((), tokenizer),
        constraint=constraint,
    )
    try:
        gconfig.check()
    except InvalidRequestError as exc:
        raise CompletionRequestError(str(exc)) from None
    return gconfig


def build_prompt_ids(
    *,
    settings: CompletionSettings,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    parent: InteractionWithTokenLogpReward | None,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
) -> list[int]:
    if settings.chat_template_type == "hf":
        return render_prompt_ids(tokenizer, messages, tools, chat_template_kwargs)
    if parent is None:
        remaining = messages
    else:
        assert parent.output_message_list is not None, "a parent is a completed call"
        remaining = messages[len(parent.messages) + len(parent.output_message_list) :]
    return concat_prompt_token_ids_with_parent(remaining, parent, tokenizer, tools, chat_template_kwargs)


def _chat_template_kwargs(extra_body: Any) -> dict[str, Any] | None:
    if extra_body is None:
        return None
    if not isinstance(extra_body, dict):
        raise CompletionRequestError(f"extra_body must be a dict, got {type(extra_body).__name__}")
    kwargs = extra_body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise CompletionRequestError("extra_body.chat_template_kwargs must be a dict")
    return kwargs


def _normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise CompletionRequestError(f"tools must be a list, got {type(tools).__name__}")
    return normalize_messages(tools) if tools else None


def check_not_aborted(resp: ModelResponse, settings: CompletionSettings) -> None:
    """GenerationAborted for a generation the engine aborted, where `settings` refuse those."""
    if resp.stop_reason == "abort" and settings.refuse_aborted:
        raise GenerationAborted(
            f"the engine aborted this generation after {len(resp.output_tokens)} tokens; nothing was "
            "recorded: send the request again"
        )


def _check_response(resp: ModelResponse, prompt: list[int]) -> None:
    n = len(resp.output_tokens)
    if len(resp.output_logprobs) != n or len(resp.output_versions) != n:
        raise RuntimeError(
            f"engine returned {n} output tokens with {len(resp.output_logprobs)} log-probs and "
            f"{len(resp.output_versions)} versions"
        )
    if list(resp.input_tokens) != list(prompt):
        raise RuntimeError("engine response input_tokens differ from the prompt it was given")


async def generate_for_messages(
    *,
    engine: InferenceEngine,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    interaction_id: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    budget_kwargs: dict[str, Any],
    sampling_kwargs: dict[str, Any],
    metadata: Any,
    input_data: Any = "",
    agent: str | None = None,
) -> tuple[InteractionWithTokenLogpReward, ModelResponse]:
    """Template → budget → cache insert → engine; shared by chat completions and responses.

    The returned interaction is in `cache` (when given) but not yet complete: the caller fills
    in its output and calls `cache.mark_completed`. If the engine fails it is removed.
    """
    if cache is not None and interaction_id in cache:
        raise CompletionRequestError(f"interaction id {interaction_id} already exists in the cache")
    chat_template_kwargs = _checked_chat_input(messages, tokenizer, chat_template_kwargs)
    context = context_tokens(engine, settings.engine_max_tokens)
    check_max_tokens(budget_kwargs, context_tokens(engine, None))  # the model's own context only
    sampling_config(
        tokenizer=None, budget=TokenBudget(1, 2), **sampling_kwargs
    )  # bad values fail before rendering
    prompt, parent = await _render_chat_prompt(
        tokenizer=tokenizer,
        settings=settings,
        cache=cache,
        messages=messages,
        tools=tools,
        chat_template_kwargs=chat_template_kwargs,
        constraint=sampling_kwargs.get("constraint"),
        agent=agent,
        context=context,
    )
    budget = resolve_token_budget(
        len(prompt),
        engine_max_tokens=settings.engine_max_tokens,
        default_max_new_tokens=settings.default_max_new_tokens,
        **budget_kwargs,
    )
    check_prompt_tokens(len(prompt), context)
    sampling = dict(sampling_kwargs)
    sampling["temperature"], sampling["top_p"] = settings.fill_sampling(
        sampling.get("temperature"), sampling.get("top_p")
    )
    gconfig = sampling_config(tokenizer=tokenizer, budget=budget, **sampling)
    if metadata is not None and not isinstance(metadata, dict):
        raise CompletionRequestError(f"metadata must be a dict, got {type(metadata).__name__}")
    interaction = InteractionWithTokenLogpReward(
        messages=messages,
        parent=parent,
        chat_template_type=settings.chat_template_type,
        tools=tools,
        chat_template_kwargs=chat_template_kwargs,
        input_data=input_data,
        agent=agent,
        _interaction_id=interaction_id,
    )
    if cache is not None:
        cache.insert(interaction_id, interaction, resolve_parent=False)  # parent found above
    request = ModelRequest(
        input_ids=prompt, gconfig=gconfig, metadata=dict(metadata or {}), tokenizer=tokenizer, agent=agent
    )
    try:
        response = await engine.agenerate(request)
        _check_response(response, prompt)
        check_not_aborted(response, settings)
    except BaseException:
        if cache is not None:
            cache.pop(interaction_id, None)
        raise
    if response.tokenizer is None:
        response.tokenizer = tokenizer
    interaction.model_response = response
    return interaction, response


def _checked_chat_input(
    messages: list[dict[str, Any]], tokenizer: Any, chat_template_kwargs: dict[str, Any] | None
) -> dict[str, Any] | None:
    check_chat_messages(messages)
    return check_chat_template_kwargs(chat_template_kwargs, tokenizer)


async def _render_chat_prompt(
    *,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    constraint: OutputConstraint | None,
    agent: str | None,
    context: int | None,
    add_generation_prompt: bool = True,
) -> tuple[list[int], InteractionWithTokenLogpReward | None]:
    """The prompt ids of a chat call and the call it continues (its parent in `cache`).
    `add_generation_prompt=False` (`/tokenize`) renders the whole conversation, no parent."""
    parent = cache.find_parent(messages, agent) if cache is not None and add_generation_prompt else None
    if (
        parent is not None
        and settings.chat_template_type == "concat"
        and not _renders_like(parent, tools, chat_template_kwargs)
    ):
        warnings.warn(
            f"this call continues interaction {parent.interaction_id}, but its tools or chat_template_kwargs "
            "differ from that call's, so the template renders the shared history differently and the "
            "parent's tokens cannot start this prompt: it is rendered whole and trained as a new root "
            "(concat mode; the earlier call gets no return from this one)",
            ConversationLinkWarning,
            stacklevel=4,
        )
        parent = None

    # the schema is shown to the model where the prompt is rendered whole (a concat child reuses
    # its parent's tokens, which show it already)
    shown = (
        messages
        if parent is not None and settings.chat_template_type == "concat"
        else (with_format_instruction(messages, constraint))
    )

    def render() -> list[int]:
        check_prompt_size(shown, tools, tokenizer, context)
        if not add_generation_prompt:
            return render_prompt_ids(
                tokenizer, shown, tools, chat_template_kwargs, add_generation_prompt=False
            )
        return build_prompt_ids(
            settings=settings,
            tokenizer=tokenizer,
            messages=shown,
            parent=parent,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
        )

    # Rendering is work proportional to the input: a long conversation goes off the event loop,
    # a short one renders in place (a thread hop costs more than rendering a few hundred chars,
    # and with 128 episodes in flight those hops were a fifth of the loop's time).
    long_input = text_chars(messages, tools) > INLINE_RENDER_CHARS
    prompt = await asyncio.to_thread(render) if long_input else render()
    return prompt, parent


def _renders_like(parent: InteractionWithTokenLogpReward, tools: Any, chat_template_kwargs: Any) -> bool:
    """Whether the template sees what it saw for `parent`: a concat child reuses the parent's tokens."""
    return (parent.tools or None) == (tools or None) and (parent.chat_template_kwargs or None) == (
        chat_template_kwargs or None
    )


def _agent_name(model: Any) -> str | None:
    """The agent a call's `model` names; the SDKs always send a string, a hand call may not."""
    if model is None:
        return None
    if not isinstance(model, str):
        raise CompletionRequestError(
            f"model must be a string (it names the agent), got {type(model).__name__}"
        )
    return model


def decode_output(tokenizer: Any, response: ModelResponse) -> str:
    return tokenizer.decode(response.output_tokens_without_stop, skip_special_tokens=False)


def cut_stop_string(text: str, response: ModelResponse, stop: Any) -> tuple[str, str | None]:
    """(text before the stop string that ended the generation, that string) — OpenAI's and
    Anthropic's APIs leave it out of the text. The tokens keep it: the model generated them.

    Only for a reply that a stop string ended (stop_reason "stop" without a trailing EOS/pad); the
    engine stops at the first match, so the earliest occurrence of any stop string is the one."""
    stops = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str) and s]
    if not stops or response.stop_reason != "stop" or not response.output_tokens or response.end_with_stop:
        return text, None
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    at, matched = min(found)
    return text[:at], matched


async def create_chat_completion(
    *,
    engine: InferenceEngine,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    messages: Any,
    tools: Any = None,
    tool_choice: Any = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    max_completion_tokens: int | None = None,
    max_total_tokens: int | None = None,
    stop: Any = None,
    store: bool | None = None,
    n: int | None = None,
    metadata: dict[str, Any] | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    extra_body: dict[str, Any] | None = None,
    logprobs: bool | None = None,
    top_k: int | None = None,
    response_format: Any = None,
    model: str | None = None,
    **ignored: Any,
):
    """One OpenAI chat completion; the call is recorded in `cache` unless `store=False`.
    `logprobs=True` returns the sampled tokens' log-probs (the ones recorded for training).
    `model` names the agent that made the call (`InteractionWithTokenLogpReward.agent`)."""
    from openai.types.chat import ChatCompletion

    completion_id = "chatcmpl-" + uuid.uuid4().hex[:29]
    normalized = normalize_messages(messages)
    n_choices = _check_choices(n)
    tools_list = _normalize_tools(tools)
    constraint = _chat_constraint(tools_list, tool_choice, response_format, extra_body)
    record = cache if store is not False else None
    # Choice i is interaction `completion_id` (i = 0) or `f"{completion_id}-{i}"`: one row each.
    ids = [completion_id] + [f"{completion_id}-{i}" for i in range(1, n_choices)]
    generate = functools.partial(
        generate_for_messages,
        engine=engine,
        tokenizer=tokenizer,
        settings=settings,
        cache=record,
        messages=normalized,
        tools=tools_list,
        chat_template_kwargs=_chat_template_kwargs(extra_body),
        budget_kwargs={
            "max_tokens": max_tokens,
            "max_completion_tokens": max_completion_tokens,
            "max_total_tokens": max_total_tokens,
        },
        sampling_kwargs={
            "temperature": temperature,
            "top_p": top_p,
            "frequency_penalty": frequency_penalty,
            "stop": stop,
            "presence_penalty": presence_penalty,
            "top_k": top_k,
            "constraint": constraint,
        },
        metadata=metadata,
        agent=_agent_name(model),
    )
    if n_choices == 1:
        samples = [await generate(interaction_id=completion_id)]
    else:
        samples = await _all_samples([generate(interaction_id=iid) for iid in ids], record, ids)
    created = int(time.time())
    choices = []
    for index, (interaction, response) in enumerate(samples):
        choice = _choice(index, response, tokenizer, settings, tools_list, tool_choice, logprobs, stop)
        choices.append(choice)
        interaction.completion = ChatCompletion(
            id=interaction.interaction_id,
            choices=[choice],
            created=created,
            model=MODEL_NAME,
            object="chat.completion",
            usage=_usage(response.input_len, response.output_len),
        )
        interaction.output_message_list = [choice.message.model_dump(exclude_none=True)]
    if record is not None:
        # choice 0 completes last: a reward sent without an id (the last call's) goes to the choice
        # agents continue with, `choices[0]`
        for interaction, _ in reversed(samples):
            assert interaction.interaction_id is not None  # its completion, set above, names it
            record.mark_completed(interaction.interaction_id)
    if n_choices == 1:
        return samples[0][0].completion
    prompt_len = samples[0][1].input_len
    return ChatCompletion(
        id=completion_id,
        choices=choices,
        created=created,
        model=MODEL_NAME,
        object="chat.completion",
        usage=_usage(prompt_len, sum(response.output_len for _, response in samples)),
    )


def _chat_constraint(
    tools_list: list[dict[str, Any]] | None, tool_choice: Any, response_format: Any, extra_body: Any
) -> OutputConstraint | None:
    check_tools(tools_list, tool_choice)
    return request_constraint(
        {
            "response_format": constraint_of_format(response_format, "response_format"),
            "tool_choice": constraint_of_tool_choice(tools_list, tool_choice),
            **constraint_of_guided(extra_body),
        }
    )


async def chat_prompt_ids(
    *,
    engine: InferenceEngine,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    messages: Any,
    tools: Any = None,
    tool_choice: Any = None,
    response_format: Any = None,
    extra_body: dict[str, Any] | None = None,
    model: str | None = None,
    add_generation_prompt: bool = True,
    **ignored: Any,
) -> list[int]:
    """The prompt ids `create_chat_completion` with these arguments would give the engine now
    (in `concat` mode its parent's tokens first, as `cache` stands): the same checks and
    rendering, nothing generated, nothing recorded. The proxy counts and tokenizes with it.
    `add_generation_prompt=False`: the conversation alone, without the assistant's opening."""
    normalized = normalize_messages(messages)
    tools_list = _normalize_tools(tools)
    constraint = _chat_constraint(tools_list, tool_choice, response_format, extra_body)
    prompt, _ = await _render_chat_prompt(
        tokenizer=tokenizer,
        settings=settings,
        cache=cache,
        messages=normalized,
        tools=tools_list,
        chat_template_kwargs=_checked_chat_input(normalized, tokenizer, _chat_template_kwargs(extra_body)),
        constraint=constraint,
        agent=_agent_name(model),
        context=context_tokens(engine, settings.engine_max_tokens),
        add_generation_prompt=add_generation_prompt,
    )
    return prompt


MAX_CHOICES = 16


def _check_choices(n: Any) -> int:
    """The number of choices (`n`): 1 ≤ n ≤ MAX_CHOICES; each is a full generation."""
    if n is None:
        return 1
    _check_positive_int("n", n)
    if n > MAX_CHOICES:
        raise CompletionRequestError(f"n={n} is more than {MAX_CHOICES} choices; make several calls instead")
    return n


async def _all_samples(calls: list[Any], cache: InteractionCache | None, ids: list[str]) -> list[Any]:
    """Run the choices' generations together: all of them, or (any failed) none left in the cache."""
    try:
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    except BaseException:  # cancelled: the finished choices' entries would stay incomplete
        _forget(cache, ids)
        raise
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        _forget(cache, ids)
        raise failed
    return outcomes


def _forget(cache: InteractionCache | None, ids: list[str]) -> None:
    if cache is None:
        return
    for iid in ids:
        cache.pop(iid, None)


def _choice(
    index: int,
    response: ModelResponse,
    tokenizer: Any,
    settings: CompletionSettings,
    tools_list: list[dict[str, Any]] | None,
    tool_choice: Any,
    logprobs: bool | None,
    stop: Any,
) -> Any:
    """One OpenAI `Choice` from an engine response: text, parsed tool calls, finish reason; a
    matched stop string is `choice.stop_reason` (an extra field, as vLLM's server reports it)."""
    from openai.types.chat import ChatCompletionMessage
    from openai.types.chat.chat_completion import Choice

    whole = decode_output(tokenizer, response)
    text, matched_stop = cut_stop_string(whole, response, stop)
    finish_reason = (
        response.stop_reason if response.stop_reason in ("stop", "length", "tool_calls") else "stop"
    )
    tool_calls = None
    if tools_list and tool_choice != "none":
        calls, new_text = parse_tool_calls(text, settings.tool_call_parser, settings.reasoning_parser)
        if not calls and matched_stop is not None:  # the stop string closed a call (stop=["</tool_call>"])
            calls, new_text = parse_tool_calls(whole, settings.tool_call_parser, settings.reasoning_parser)
        if calls:
            tool_calls, text = tool_calls_to_openai(calls), new_text
            if finish_reason == "stop":
                finish_reason = "tool_calls"
    message = ChatCompletionMessage(role="assistant", content=text, tool_calls=tool_calls)
    choice = Choice(
        index=index,
        finish_reason=finish_reason,
        message=message,
        logprobs=sampled_logprobs(tokenizer, response) if logprobs else None,
    )
    if matched_stop is not None:
        # vLLM's extra field (the stop string that ended the reply): the openai model keeps extras
        # but does not declare this one
        setattr(choice, "stop_reason", matched_stop)  # noqa: B010
    return choice


def _usage(prompt_tokens: int, completion_tokens: int) -> Any:
    from openai.types.completion_usage import CompletionUsage

    return CompletionUsage(
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def sampled_logprobs(tokenizer: Any, response: ModelResponse) -> Any:
    """OpenAI's `choice.logprobs` for every token the reply sampled, the end token included (as
    vLLM gives it): one entry per token `usage.completion_tokens` counts, each with the log-prob
    recorded for training. The end token's entry is its own text (`<|im_end|>`), which the
    message's content leaves out."""
    from openai.types.chat import ChatCompletionTokenLogprob
    from openai.types.chat.chat_completion import ChoiceLogprobs

    content = []
    for token_id, logprob in zip(response.output_tokens, response.output_logprobs, strict=True):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append(
            ChatCompletionTokenLogprob(
                token=text, bytes=list(text.encode()), logprob=logprob, top_logprobs=[]
            )
        )
    return ChoiceLogprobs(content=content)


def chat_completion_stream_chunks(completion: Any) -> list[Any]:
    """OpenAI-shaped stream chunks of a finished completion: per choice (by `index`) its role,
    content, tool calls and finish chunks; the usage on the last chunk."""
    from openai.types.chat import ChatCompletionChunk
    from openai.types.chat.chat_completion_chunk import (
        Choice,
        ChoiceDelta,
        ChoiceDeltaToolCall,
        ChoiceDeltaToolCallFunction,
    )

    def chunk(
        index: int,
        delta: ChoiceDelta,
        finish_reason: str | None = None,
        usage: Any = None,
        logprobs: Any = None,
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=completion.id,
            choices=[Choice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)],
            created=completion.created,
            model=completion.model,
            object="chat.completion.chunk",
            usage=usage,
        )

    chunks = []
    last = len(completion.choices) - 1
    for choice in completion.choices:
        i = choice.index
        chunks.append(chunk(i, ChoiceDelta(role="assistant", content="")))
        # every token's log-prob, once: with the content, else (a tool call, an empty reply) on the finish chunk
        logprobs = choice.logprobs.model_dump() if choice.logprobs is not None else None
        if choice.message.content:
            chunks.append(chunk(i, ChoiceDelta(content=choice.message.content), logprobs=logprobs))
            logprobs = None
        for j, call in enumerate(choice.message.tool_calls or []):
            delta_call = ChoiceDeltaToolCall(
                index=j,
                id=call.id,
                type="function",
                function=ChoiceDeltaToolCallFunction(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            chunks.append(chunk(i, ChoiceDelta(tool_calls=[delta_call])))
        chunks.append(
            chunk(
                i,
                ChoiceDelta(),
                finish_reason=choice.finish_reason,
                logprobs=logprobs,
                usage=completion.usage if choice is completion.choices[last] else None,
            )
        )
    return chunks

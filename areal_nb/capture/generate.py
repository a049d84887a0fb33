"""The core every door shares: a chat conversation in, a recorded generation out.

`generate_for_messages` checks the request, finds the call it continues (its parent in the
`InteractionCache`), renders the prompt (hf or concat template; a long conversation in a worker
thread so it never blocks the event loop), resolves the token budget, inserts the interaction
and asks the engine. Invalid requests raise `CompletionRequestError` (an `InvalidRequestError`,
HTTP 400 in the proxy) before anything is cached; a failing engine call removes its cache entry,
so the cache never holds an incomplete interaction because of an error. The doors (`chat.py`,
`responses.py`, `text_completion.py`; Anthropic Messages through `anthropic.py` and the chat
door) convert their request, call this, and render the reply with the helpers at the end.
"""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import dataclass, replace
from typing import Any

from areal_nb.api import InferenceEngine, ModelRequest, ModelResponse, OutputConstraint
from areal_nb.errors import EngineServerError, GenerationAborted

from .cache import ConversationLinkWarning, InteractionCache
from .interaction import InteractionWithTokenLogpReward
from .messages import CompletionRequestError, check_chat_messages, normalize_messages
from .request_limits import (
    check_chat_template_kwargs,
    check_max_tokens,
    check_prompt_size,
    check_prompt_tokens,
    context_tokens,
    text_chars,
)
from .settings import (
    CompletionSettings,
    SamplingRequest,
    TokenBudget,
    check_positive_int,
    resolve_token_budget,
    sampling_config,
)
from .structured import with_format_instruction
from .templates import concat_prompt_token_ids_with_parent, render_prompt_ids

MODEL_NAME = "areal-nb"
# Conversations up to this many characters are rendered on the event loop, longer ones in a thread.
# Rendering + tokenizing costs ~0.5 us/char of prose and ~1.2 us/char of digits (tiny-math), so at
# 2 KiB the loop is held ~2.5 ms at most; at 16 KiB it was held up to 21 ms, and a hostile 6 KB
# over-context prompt held it 7 ms a time (tests/proxy/test_chaos.py's /health p99). A thread
# hop costs the loop ~0.03 ms, small next to rendering 2 KiB; tiny-math prompts stay inline.
INLINE_RENDER_CHARS = 2 * 1024


@dataclass(frozen=True)
class CompletionBackend:
    """What a door's call runs on: the engine that generates, the tokenizer that renders and
    decodes, the client's or proxy's settings, and the cache that records the call (None: the
    call is answered and not recorded)."""

    engine: InferenceEngine
    tokenizer: Any
    settings: CompletionSettings
    cache: InteractionCache | None

    def recording(self, store: bool | None) -> CompletionBackend:
        """This backend for a request's `store`: `store=False` is answered, not recorded."""
        return self if store is not False else replace(self, cache=None)


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


def chat_template_kwargs_of(extra_body: Any) -> dict[str, Any] | None:
    if extra_body is None:
        return None
    if not isinstance(extra_body, dict):
        raise CompletionRequestError(f"extra_body must be a dict, got {type(extra_body).__name__}")
    kwargs = extra_body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise CompletionRequestError("extra_body.chat_template_kwargs must be a dict")
    return kwargs


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
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


def _check_engine_response(resp: ModelResponse, prompt: list[int]) -> None:
    n = len(resp.output_tokens)
    if len(resp.output_logprobs) != n or len(resp.output_versions) != n:
        raise EngineServerError(
            f"engine returned {n} output tokens with {len(resp.output_logprobs)} log-probs and "
            f"{len(resp.output_versions)} versions"
        )
    if list(resp.input_tokens) != list(prompt):
        raise EngineServerError("engine response input_tokens differ from the prompt it was given")


async def generate_for_messages(
    backend: CompletionBackend,
    *,
    interaction_id: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    budget_kwargs: dict[str, Any],
    sampling: SamplingRequest,
    metadata: Any,
    input_data: Any = "",
    agent: str | None = None,
) -> tuple[InteractionWithTokenLogpReward, ModelResponse]:
    """Template → budget → cache insert → engine; shared by chat completions and responses.

    The returned interaction is in `backend.cache` (when given) but not yet complete: the caller
    fills in its output and calls `cache.mark_completed`. If the engine fails it is removed.
    """
    engine, tokenizer, settings, cache = backend.engine, backend.tokenizer, backend.settings, backend.cache
    if cache is not None and interaction_id in cache:
        raise CompletionRequestError(f"interaction id {interaction_id} already exists in the cache")
    chat_template_kwargs = checked_chat_input(messages, tokenizer, chat_template_kwargs)
    context = context_tokens(engine, settings.engine_max_tokens)
    check_max_tokens(budget_kwargs, context_tokens(engine, None))  # the model's own context only
    sampling_config(sampling, tokenizer=None, budget=TokenBudget(1, 2))  # bad values fail before rendering
    prompt, parent = await render_chat_prompt(
        backend,
        messages=messages,
        tools=tools,
        chat_template_kwargs=chat_template_kwargs,
        constraint=sampling.constraint,
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
    gconfig = sampling_config(settings.fill_sampling(sampling), tokenizer=tokenizer, budget=budget)
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
    request = ModelRequest(
        input_ids=prompt, gconfig=gconfig, metadata=dict(metadata or {}), tokenizer=tokenizer, agent=agent
    )
    response = await generate_recorded(backend, interaction, request)
    return interaction, response


async def generate_recorded(
    backend: CompletionBackend, interaction: InteractionWithTokenLogpReward, request: ModelRequest
) -> ModelResponse:
    """Insert `interaction` in the backend's cache (its parent already found), ask the engine, and
    give the interaction the response; an engine failure (or an aborted generation where the
    settings refuse those) removes the entry, so the cache never keeps an interaction that cannot
    complete."""
    cache, interaction_id = backend.cache, interaction.interaction_id
    assert interaction_id is not None, "the door names every call it records"
    if cache is not None:
        cache.insert(interaction_id, interaction, resolve_parent=False)
    try:
        response = await backend.engine.agenerate(request)
        _check_engine_response(response, request.input_ids)
        check_not_aborted(response, backend.settings)
    except BaseException:
        if cache is not None:
            cache.pop(interaction_id, None)
        raise
    if response.tokenizer is None:
        response.tokenizer = request.tokenizer
    interaction.model_response = response
    return response


def checked_chat_input(
    messages: list[dict[str, Any]], tokenizer: Any, chat_template_kwargs: dict[str, Any] | None
) -> dict[str, Any] | None:
    check_chat_messages(messages)
    return check_chat_template_kwargs(chat_template_kwargs, tokenizer)


async def render_chat_prompt(
    backend: CompletionBackend,
    *,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    constraint: OutputConstraint | None,
    agent: str | None,
    context: int | None,
    add_generation_prompt: bool = True,
) -> tuple[list[int], InteractionWithTokenLogpReward | None]:
    """The prompt ids of a chat call and the call it continues (its parent in the backend's
    cache). `add_generation_prompt=False` (`/tokenize`) renders the whole conversation, no parent."""
    tokenizer, settings, cache = backend.tokenizer, backend.settings, backend.cache
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


def agent_name(model: Any) -> str | None:
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


MAX_CHOICES = 16


def check_choices(n: Any) -> int:
    """The number of choices (`n`): 1 ≤ n ≤ MAX_CHOICES; each is a full generation."""
    if n is None:
        return 1
    check_positive_int("n", n)
    if n > MAX_CHOICES:
        raise CompletionRequestError(f"n={n} is more than {MAX_CHOICES} choices; make several calls instead")
    return n


async def all_samples(calls: list[Any], cache: InteractionCache | None, ids: list[str]) -> list[Any]:
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


def mark_completed_last_first(
    cache: InteractionCache | None, interactions: list[InteractionWithTokenLogpReward]
) -> None:
    """Mark a call's interactions completed, choice 0 last: a reward sent without an id (the
    last completed call's) goes to the choice agents continue with, `choices[0]`."""
    if cache is None:
        return
    for interaction in reversed(interactions):
        assert interaction.interaction_id is not None  # its completion, set by the door, names it
        cache.mark_completed(interaction.interaction_id)


def _forget(cache: InteractionCache | None, ids: list[str]) -> None:
    if cache is None:
        return
    for iid in ids:
        cache.pop(iid, None)


def completion_usage(prompt_tokens: int, completion_tokens: int) -> Any:
    from openai.types.completion_usage import CompletionUsage

    return CompletionUsage(
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )

"""The chat-completions door (`/v1/chat/completions`, `ArealOpenAI.chat.completions`).

`create_chat_completion` converts the request (messages, tools, `tool_choice` and structured
output as an engine constraint, `n` choices), runs the shared core (`generate.py`) once per
choice and renders each reply as an OpenAI `ChatCompletion` choice: text, parsed tool calls,
finish reason, optional log-probs. Anthropic Messages calls come through here too, converted by
`anthropic.py`. `chat_prompt_ids` gives the prompt a call would get, for counting and tokenizing.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass
from typing import Any

from areal_nb.api import InferenceEngine, ModelResponse, OutputConstraint

from .cache import InteractionCache
from .generate import (
    MODEL_NAME,
    CompletionBackend,
    agent_name,
    all_samples,
    chat_template_kwargs_of,
    check_choices,
    checked_chat_input,
    completion_usage,
    cut_stop_string,
    decode_output,
    generate_for_messages,
    mark_completed_last_first,
    normalize_tools,
    render_chat_prompt,
)
from .interaction import InteractionWithTokenLogpReward
from .messages import normalize_messages
from .request_limits import context_tokens
from .settings import CompletionSettings, SamplingRequest
from .structured import (
    constraint_of_format,
    constraint_of_guided,
    constraint_of_tool_choice,
    request_constraint,
)
from .tool_calls import parse_tool_calls, tool_calls_to_openai
from .tool_specs import check_tools

__all__ = ["chat_completion_stream_chunks", "chat_prompt_ids", "create_chat_completion", "sampled_logprobs"]


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
    completion_id = "chatcmpl-" + uuid.uuid4().hex[:29]
    normalized = normalize_messages(messages)
    n_choices = check_choices(n)
    tools_list = normalize_tools(tools)
    constraint = _chat_constraint(tools_list, tool_choice, response_format, extra_body)
    backend = CompletionBackend(engine, tokenizer, settings, cache).recording(store)
    # Choice i is interaction `completion_id` (i = 0) or `f"{completion_id}-{i}"`: one row each.
    ids = [completion_id] + [f"{completion_id}-{i}" for i in range(1, n_choices)]
    generate = functools.partial(
        generate_for_messages,
        backend,
        messages=normalized,
        tools=tools_list,
        chat_template_kwargs=chat_template_kwargs_of(extra_body),
        budget_kwargs={
            "max_tokens": max_tokens,
            "max_completion_tokens": max_completion_tokens,
            "max_total_tokens": max_total_tokens,
        },
        sampling=SamplingRequest(
            temperature=temperature,
            top_p=top_p,
            frequency_penalty=frequency_penalty,
            stop=stop,
            presence_penalty=presence_penalty,
            top_k=top_k,
            constraint=constraint,
        ),
        metadata=metadata,
        agent=agent_name(model),
    )
    if n_choices == 1:
        samples = [await generate(interaction_id=completion_id)]
    else:
        samples = await all_samples([generate(interaction_id=iid) for iid in ids], backend.cache, ids)
    completion = _render_completion(
        completion_id, samples, _ChoiceRendering(tokenizer, settings, tools_list, tool_choice, logprobs, stop)
    )
    mark_completed_last_first(backend.cache, [interaction for interaction, _ in samples])
    return completion


def _render_completion(
    completion_id: str,
    samples: list[tuple[InteractionWithTokenLogpReward, ModelResponse]],
    rendering: _ChoiceRendering,
) -> Any:
    """The `ChatCompletion` of all choices; each choice's interaction gets its own one-choice
    `ChatCompletion` and the reply as its output message (what a next call echoes back)."""
    from openai.types.chat import ChatCompletion

    created = int(time.time())
    choices = []
    for index, (interaction, response) in enumerate(samples):
        choice = rendering.choice(index, response)
        choices.append(choice)
        interaction.completion = ChatCompletion(
            id=interaction.interaction_id,
            choices=[choice],
            created=created,
            model=MODEL_NAME,
            object="chat.completion",
            usage=completion_usage(response.input_len, response.output_len),
        )
        interaction.output_message_list = [choice.message.model_dump(exclude_none=True)]
    if len(samples) == 1:
        return samples[0][0].completion
    prompt_len = samples[0][1].input_len
    return ChatCompletion(
        id=completion_id,
        choices=choices,
        created=created,
        model=MODEL_NAME,
        object="chat.completion",
        usage=completion_usage(prompt_len, sum(response.output_len for _, response in samples)),
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
    backend: CompletionBackend,
    *,
    messages: Any,
    tools: Any = None,
    tool_choice: Any = None,
    response_format: Any = None,
    extra_body: dict[str, Any] | None = None,
    model: str | None = None,
    add_generation_prompt: bool = True,
    **ignored: Any,
) -> list[int]:
    """The prompt ids `create_chat_completion` with these arguments would give `backend.engine`
    now (in `concat` mode its parent's tokens first, as `backend.cache` stands): the same checks and
    rendering, nothing generated, nothing recorded. The proxy counts and tokenizes with it.
    `add_generation_prompt=False`: the conversation alone, without the assistant's opening."""
    normalized = normalize_messages(messages)
    tools_list = normalize_tools(tools)
    constraint = _chat_constraint(tools_list, tool_choice, response_format, extra_body)
    prompt, _ = await render_chat_prompt(
        backend,
        messages=normalized,
        tools=tools_list,
        chat_template_kwargs=checked_chat_input(
            normalized, backend.tokenizer, chat_template_kwargs_of(extra_body)
        ),
        constraint=constraint,
        agent=agent_name(model),
        context=context_tokens(backend.engine, backend.settings.engine_max_tokens),
        add_generation_prompt=add_generation_prompt,
    )
    return prompt


@dataclass(frozen=True)
class _ChoiceRendering:
    """What turns each engine response of one request into its OpenAI `Choice`: the request's
    tools, `tool_choice`, `logprobs` and `stop`, and the client's parsers."""

    tokenizer: Any
    settings: CompletionSettings
    tools_list: list[dict[str, Any]] | None
    tool_choice: Any
    logprobs: bool | None
    stop: Any

    def choice(self, index: int, response: ModelResponse) -> Any:
        """One OpenAI `Choice` from an engine response: text, parsed tool calls, finish reason; a
        matched stop string is `choice.stop_reason` (an extra field, as vLLM's server reports it)."""
        from openai.types.chat import ChatCompletionMessage
        from openai.types.chat.chat_completion import Choice

        whole = decode_output(self.tokenizer, response)
        text, matched_stop = cut_stop_string(whole, response, self.stop)
        finish_reason = (
            response.stop_reason if response.stop_reason in ("stop", "length", "tool_calls") else "stop"
        )
        tool_calls = None
        if self.tools_list and self.tool_choice != "none":
            parser, reasoning_parser = self.settings.tool_call_parser, self.settings.reasoning_parser
            calls, new_text = parse_tool_calls(text, parser, reasoning_parser)
            if not calls and matched_stop is not None:  # the stop string closed a call ("</tool_call>")
                calls, new_text = parse_tool_calls(whole, parser, reasoning_parser)
            if calls:
                tool_calls, text = tool_calls_to_openai(calls), new_text
                if finish_reason == "stop":
                    finish_reason = "tool_calls"
        message = ChatCompletionMessage(role="assistant", content=text, tool_calls=tool_calls)
        choice = Choice(
            index=index,
            finish_reason=finish_reason,
            message=message,
            logprobs=sampled_logprobs(self.tokenizer, response) if self.logprobs else None,
        )
        if matched_stop is not None:
            # vLLM's extra field (the stop string that ended the reply): the openai model keeps extras
            # but does not declare this one
            setattr(choice, "stop_reason", matched_stop)  # noqa: B010
        return choice


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

"""OpenAI's legacy text completions (`/v1/completions`, as vLLM serves them), recorded like chat.

No chat template: a string prompt is encoded as it is, with the tokenizer's special tokens
(`add_special_tokens=True`, vLLM's default, so a model with a BOS token gets it); a prompt of
token ids is sent as it is. Each sample of each prompt is one interaction, one training row of
the exact prompt and output ids, log-probs and versions; `n` and a batch of prompts give
`len(prompts) × n` of them, choice `i = prompt × n + sample`, interaction `id` (i = 0) or
`f"{id}-{i}"`, the order OpenAI and vLLM give choices in.

A text completion is never a chat call's parent, nor the other way round. Its parent is the
completed text completion of the same agent whose prompt and returned text begin this prompt
(the longest such), so an agent that appends each reply and an observation to its prompt builds
a conversation tree, and the tree discount carries its reward back. In `concat` mode a row
reuses its parent's tokens, so the link also needs this prompt's ids to start with the parent's
prompt and output ids: a string prompt whose re-encoding split the text differently starts a
new root, with a warning (send the prompt as token ids to keep the link).
"""

from __future__ import annotations

import time
import uuid
import warnings
from typing import Any

from areal_nb.api import InferenceEngine, ModelRequest, ModelResponse

from .cache import ConversationLinkWarning, InteractionCache
from .generate import (
    MODEL_NAME,
    CompletionBackend,
    agent_name,
    all_samples,
    check_choices,
    completion_usage,
    cut_stop_string,
    decode_output,
    generate_recorded,
    mark_completed_last_first,
)
from .interaction import InteractionWithTokenLogpReward
from .messages import CompletionRequestError
from .request_limits import check_max_tokens, check_prompt_tokens, context_tokens
from .settings import (
    CompletionSettings,
    SamplingRequest,
    TokenBudget,
    resolve_token_budget,
    sampling_config,
)
from .tokens import check_text_fits, check_token_ids, decode_ids, encode_text

_MAX_GENERATIONS = 64  # len(prompts) × n in one call; each is a full generation and a row
_PROMPT_ROLE = "prompt"  # the recorded `messages` of a text completion: [{"role": "prompt", ...}]


def _prompts(prompt: Any, tokenizer: Any) -> list[str | list[int]]:
    """The prompts of a request: a string, a list of token ids, or a list of either."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise CompletionRequestError(
            "prompt must be a string, a list of token ids, or a non-empty list of those"
        )
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [check_token_ids(prompt, tokenizer, "prompt")]
    out: list[str | list[int]] = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            out.append(check_token_ids(item, tokenizer, f"prompt[{i}]"))
        else:
            raise CompletionRequestError(
                f"prompt[{i}] must be a string or a list of token ids, got {type(item).__name__}"
            )
    return out


def _check_logprobs(logprobs: Any) -> bool:
    if logprobs is None:
        return False
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
        raise CompletionRequestError(f"logprobs must be an integer ≥ 0, got {logprobs!r:.40}")
    if logprobs > 0:
        raise CompletionRequestError(
            f"logprobs={logprobs} asks for the {logprobs} most likely tokens at each step, but only "
            "the sampled tokens' log-probs are known: send logprobs=0 (they are the ones recorded "
            "for training)"
        )
    return True


def _check_flag(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise CompletionRequestError(f"{name} must be true or false, got {value!r:.40}")
    return value


def _history_text(interaction: InteractionWithTokenLogpReward) -> str:
    """What a text completion's agent saw: its prompt and then the text it got back."""
    prompt = interaction.messages[0]["content"] if interaction.messages else ""
    reply = (interaction.output_message_list or [{}])[0].get("content") or ""
    return prompt + reply


def find_text_parent(
    cache: InteractionCache | None, prompt_text: str, prompt_ids: list[int], agent: str | None, concat: bool
) -> InteractionWithTokenLogpReward | None:
    """The completed text completion of `agent` whose prompt and reply begin `prompt_text` (the
    longest); in `concat` mode only if `prompt_ids` also start with its prompt and output ids."""
    if cache is None:
        return None
    best, best_len = None, -1
    for candidate in cache.snapshot():
        if not candidate.is_complete or not candidate.is_text_completion or candidate.agent != agent:
            continue
        history = _history_text(candidate)
        if prompt_text.startswith(history) and len(history) > best_len:
            best, best_len = candidate, len(history)
    if best is None or not concat:
        return best
    mr = best.model_response
    prefix = [] if mr is None else list(mr.input_tokens) + mr.output_tokens_without_stop
    if mr is None or prompt_ids[: len(prefix)] != prefix:
        warnings.warn(
            f"this prompt continues the text of completion {best.interaction_id}, but its token ids do "
            "not start with that call's prompt and output ids (its text was encoded into other "
            "tokens), so in concat mode it starts a new row and a new tree; send the prompt as "
            "token ids (the earlier prompt's ids + the output ids + the new ids) to keep the link",
            ConversationLinkWarning,
            stacklevel=4,
        )
        return None
    return best


async def create_text_completion(
    *,
    engine: InferenceEngine,
    tokenizer: Any,
    settings: CompletionSettings,
    cache: InteractionCache | None,
    prompt: Any,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: Any = None,
    logprobs: int | None = None,
    echo: bool | None = None,
    n: int | None = None,
    store: bool | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    top_k: int | None = None,
    model: str | None = None,
    **ignored: Any,
) -> Any:
    """One OpenAI text `Completion`; every sample is recorded in `cache` unless `store=False`.
    `logprobs=0` returns the sampled tokens' log-probs (the recorded ones); `echo` puts the
    prompt before each choice's text (its tokens with log-prob None: the engine scores no prompt).
    `model` names the agent that made the call."""
    # Check the options, encode the prompts, run one recorded generation per sample (`sample`,
    # a closure over the checked request), render the Completion: long for the checks done
    # before anything is generated, which a batch of prompts needs all of before the first sample.
    prompts = _prompts(prompt, tokenizer)
    n_choices = check_choices(n)
    if len(prompts) * n_choices > _MAX_GENERATIONS:
        raise CompletionRequestError(
            f"{len(prompts)} prompts × n={n_choices} are {len(prompts) * n_choices} generations, more "
            f"than {_MAX_GENERATIONS} in one call; make several calls instead"
        )
    with_logprobs = _check_logprobs(logprobs)
    with_echo = _check_flag("echo", echo)
    sampling = settings.fill_sampling(
        SamplingRequest(
            temperature=temperature,
            top_p=top_p,
            frequency_penalty=frequency_penalty,
            stop=stop,
            presence_penalty=presence_penalty,
            top_k=top_k,
        )
    )
    sampling_config(sampling, tokenizer=None, budget=TokenBudget(1, 2))  # bad values fail first
    context = context_tokens(engine, settings.engine_max_tokens)
    check_max_tokens({"max_tokens": max_tokens}, context_tokens(engine, None))
    agent = agent_name(model)
    backend = CompletionBackend(engine, tokenizer, settings, cache).recording(store)
    encoded = await _encode_prompts(prompts, tokenizer, context)

    completion_id = "cmpl-" + uuid.uuid4().hex[:29]
    ids_of_choices = [completion_id] + [f"{completion_id}-{i}" for i in range(1, len(encoded) * n_choices)]

    async def sample(index: int) -> tuple[InteractionWithTokenLogpReward, ModelResponse]:
        text, ids = encoded[index // n_choices]
        budget = resolve_token_budget(
            len(ids),
            max_tokens=max_tokens,
            engine_max_tokens=settings.engine_max_tokens,
            default_max_new_tokens=settings.default_max_new_tokens,
        )
        gconfig = sampling_config(sampling, tokenizer=tokenizer, budget=budget)
        interaction = InteractionWithTokenLogpReward(
            messages=[{"role": _PROMPT_ROLE, "content": text}],
            parent=find_text_parent(backend.cache, text, ids, agent, settings.chat_template_type == "concat"),
            chat_template_type=settings.chat_template_type,
            input_data=prompt,
            agent=agent,
            _interaction_id=ids_of_choices[index],
        )
        request = ModelRequest(input_ids=list(ids), gconfig=gconfig, tokenizer=tokenizer, agent=agent)
        return interaction, await generate_recorded(backend, interaction, request)

    if len(ids_of_choices) == 1:
        samples = [await sample(0)]
    else:
        calls = [sample(i) for i in range(len(ids_of_choices))]
        samples = await all_samples(calls, backend.cache, ids_of_choices)
    completion = _render_completion(
        completion_id, samples, encoded, n_choices, tokenizer, stop, with_logprobs, with_echo
    )
    mark_completed_last_first(backend.cache, [interaction for interaction, _ in samples])
    return completion


async def _encode_prompts(
    prompts: list[str | list[int]], tokenizer: Any, context: int | None
) -> list[tuple[str, list[int]]]:
    """(text, ids) of each prompt: a string encoded with the special tokens, token ids decoded;
    each checked against the context before and after encoding."""
    encoded: list[tuple[str, list[int]]] = []
    for i, item in enumerate(prompts):
        if isinstance(item, str):
            check_text_fits(item, tokenizer, context, "prompt" if len(prompts) == 1 else f"prompt[{i}]")
            text, ids = item, await encode_text(tokenizer, item, add_special_tokens=True)
        else:
            check_prompt_tokens(len(item), context)  # before decoding a long list
            text, ids = decode_ids(tokenizer, item), item
        if not ids:
            raise CompletionRequestError(f"prompt{'' if len(prompts) == 1 else f'[{i}]'} is empty")
        check_prompt_tokens(len(ids), context)
        encoded.append((text, ids))
    return encoded


def _render_completion(
    completion_id: str,
    samples: list[tuple[InteractionWithTokenLogpReward, ModelResponse]],
    encoded: list[tuple[str, list[int]]],
    n_choices: int,
    tokenizer: Any,
    stop: Any,
    with_logprobs: bool,
    with_echo: bool,
) -> Any:
    """The OpenAI `Completion` of all samples; each sample's interaction gets its own one-choice
    `Completion` and its reply (without the echoed prompt) as its output message."""
    from openai.types import Completion

    created = int(time.time())
    choices = []
    for index, (interaction, response) in enumerate(samples):
        prompt_text, _ = encoded[index // n_choices]
        choice = _choice(index, response, tokenizer, stop, with_logprobs, prompt_text if with_echo else None)
        choices.append(choice)
        reply = choice.text[len(prompt_text) :] if with_echo else choice.text
        interaction.output_message_list = [{"role": "assistant", "content": reply}]
        interaction.completion = Completion.construct(
            id=interaction.interaction_id,
            choices=[_reindexed(choice, 0)],
            created=created,
            model=MODEL_NAME,
            object="text_completion",
            usage=completion_usage(response.input_len, response.output_len),
        )
    if len(samples) == 1:
        return samples[0][0].completion
    return Completion.construct(
        id=completion_id,
        choices=choices,
        created=created,
        model=MODEL_NAME,
        object="text_completion",
        usage=completion_usage(sum(len(ids) for _, ids in encoded), sum(r.output_len for _, r in samples)),
    )


def _reindexed(choice: Any, index: int) -> Any:
    copy = choice.model_copy()
    copy.index = index
    return copy


def _choice(
    index: int,
    response: ModelResponse,
    tokenizer: Any,
    stop: Any,
    with_logprobs: bool,
    echoed: str | None,
) -> Any:
    """One `CompletionChoice`: the reply's text (after the echoed prompt), finish reason, and
    with `logprobs=0` every token's log-prob (the echoed prompt's are None); a matched stop
    string is `choice.stop_reason`, as vLLM reports it."""
    from openai.types.completion_choice import CompletionChoice, Logprobs

    text, matched_stop = cut_stop_string(decode_output(tokenizer, response), response, stop)
    finish_reason = "length" if response.stop_reason == "length" else "stop"
    token_logprobs: Logprobs | None = None
    if with_logprobs:
        ids: list[int] = list(response.input_tokens) if echoed is not None else []
        values: list[float | None] = [None] * len(ids) + [float(x) for x in response.output_logprobs]
        ids += list(response.output_tokens)
        tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        # built with `construct`: the echoed prompt's None log-probs (vLLM's answer) are outside
        # the SDK's declared types, which the SDK itself parses leniently the same way
        token_logprobs = Logprobs.construct(
            tokens=tokens,
            token_logprobs=values,
            top_logprobs=[None if v is None else {t: v} for t, v in zip(tokens, values, strict=True)],
            text_offset=offsets,
        )
    choice = CompletionChoice.construct(
        index=index,
        text=(echoed or "") + text,
        finish_reason=finish_reason,
        logprobs=token_logprobs,
    )
    if matched_stop is not None:
        # vLLM's extra field (the stop string that ended the reply): the openai model keeps extras
        # but does not declare this one
        setattr(choice, "stop_reason", matched_stop)  # noqa: B010
    return choice


def text_completion_stream_chunks(completion: Any) -> list[Any]:
    """Completion-shaped stream chunks of a finished completion: per choice its text (with its
    log-probs), then its finish reason; the usage on the last chunk."""
    from openai.types import Completion
    from openai.types.completion_choice import CompletionChoice

    chunks = []
    last = len(completion.choices) - 1
    for n, choice in enumerate(completion.choices):
        for finish in (False, True):
            piece = CompletionChoice.construct(  # finish_reason None until the last chunk
                index=choice.index,
                text="" if finish else choice.text,
                logprobs=None if finish else choice.logprobs,
                finish_reason=choice.finish_reason if finish else None,
            )
            if finish and getattr(choice, "stop_reason", None) is not None:
                setattr(piece, "stop_reason", choice.stop_reason)  # noqa: B010 (undeclared extra, as above)
            chunks.append(
                Completion.construct(
                    id=completion.id,
                    choices=[piece],
                    created=completion.created,
                    model=completion.model,
                    object="text_completion",
                    usage=completion.usage if finish and n == last else None,
                )
            )
    return chunks


__all__ = ["create_text_completion", "find_text_parent", "text_completion_stream_chunks"]

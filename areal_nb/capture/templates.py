"""Prompt token ids from chat messages: `hf` (render everything) and `concat` (reuse the parent).

`concat` builds a child's prompt as its parent's exact tokens plus only the newly templated
suffix, so one row root→leaf holds the tokens the engine actually produced even when a chat
template would re-render history differently (docs/reference/areal-semantics.md, "Concat prompts").
The suffix is found by
EOS counting: the parent's tokens hold N EOS tokens; the suffix is the full-conversation
template after its N-th EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_nb.errors import (
    ConcatAlignmentError,  # noqa: F401 (re-exported)
    IncompleteInteractionError,
    InvalidArgumentError,
)

from .interaction import InteractionWithTokenLogpReward
from .messages import CompletionRequestError
from .prompt_memo import prompt_memo
from .tool_specs import template_renders_tools, with_tools_section


def render_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The tokenizer's chat template over `messages`, with the generation prompt, as ids.

    A conversation rendered recently comes from the tokenizer's `PromptMemo` (a GRPO group
    sends its prompt once per sample). A conversation the template rejects (`raise_exception` in
    the template) is the caller's input error: `CompletionRequestError`. Tools given to a
    template that never reads `tools` are shown in the system message instead
    (`tool_specs.with_tools_section`).
    `add_generation_prompt=False` (what `/tokenize` may ask for) renders without the
    assistant's opening and is never memoised.
    """
    tools = tools or None
    memo = prompt_memo(tokenizer)

    def render() -> list[int]:
        return _render_prompt_ids(tokenizer, messages, tools, chat_template_kwargs, add_generation_prompt)

    if memo is None or not add_generation_prompt:
        return render()
    return memo.ids(
        getattr(tokenizer, "chat_template", None), (messages, tools, chat_template_kwargs), render
    )


def _render_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
) -> list[int]:
    from jinja2 import TemplateError

    if tools and not template_renders_tools(getattr(tokenizer, "chat_template", None)):
        messages, tools = with_tools_section(messages, tools), None
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            **(chat_template_kwargs or {}),
        )
    except TemplateError as exc:
        raise CompletionRequestError(f"the model's chat template rejected this conversation: {exc}") from exc
    if hasattr(ids, "keys"):  # some tokenizers ignore return_dict=False
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _parent_prefix_tokens(parent: InteractionWithTokenLogpReward, eos_token_id: int) -> list[int]:
    """The parent's tokens as a child's prompt starts: trailing EOS/pad stripped, one EOS added."""
    mr = parent.model_response
    if mr is None:
        raise IncompleteInteractionError(f"Parent interaction {parent.interaction_id} has no model_response.")
    return list(mr.input_tokens) + mr.output_tokens_without_stop + [eos_token_id]


def concat_prompt_token_ids_with_parent(
    message_list: list[dict[str, Any]],
    parent: InteractionWithTokenLogpReward | None,
    tokenizer: Any,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Prompt ids for a call whose new messages are `message_list` (after the parent's)."""
    if parent is None:
        return render_prompt_ids(tokenizer, message_list, tools, chat_template_kwargs)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InvalidArgumentError("concat chat template mode needs a tokenizer with an eos_token_id")
    if parent.output_message_list is None:
        raise IncompleteInteractionError(f"Parent interaction {parent.interaction_id} has no output yet.")
    parent_tokens = _parent_prefix_tokens(parent, eos)
    all_messages = parent.messages + parent.output_message_list + list(message_list)
    all_tokens = render_prompt_ids(tokenizer, all_messages, tools, chat_template_kwargs)
    n_eos = parent_tokens.count(eos)
    seen, cut = 0, None
    for i, tok in enumerate(all_tokens):
        if tok == eos:
            seen += 1
            if seen == n_eos:
                cut = i
                break
    if cut is None or cut + 1 >= len(all_tokens):
        raise ConcatAlignmentError(
            f"Failed to align child tokens with parent tokens in concat prompt: the parent "
            f"{parent.interaction_id} holds {n_eos} EOS token(s) but the rendered conversation "
            f"({len(all_tokens)} tokens) has {all_tokens.count(eos)} EOS and "
            f"{'nothing' if cut is not None else 'no matching EOS'} after the {n_eos}-th. "
            "Did the model generate an EOS inside its content, or does the chat template not end "
            "every message with EOS? Use chat_template_type='hf' for this model."
        )
    return parent_tokens + all_tokens[cut + 1 :]


@dataclass
class RetokenizationCheck:
    """Whether a call's prompt equals a plain re-render of its conversation.

    In concat mode a difference ("retokenization drift") means training on the concat row
    differs from what an `hf` re-render would have shown the model.
    """

    interaction_id: str | None
    matches: bool
    first_difference: int | None  # token index where they first differ (None if equal)
    prompt_ids: list[int]  # what the engine saw
    rendered_ids: list[int]  # the hf template of the whole conversation


def check_retokenization(
    interaction: InteractionWithTokenLogpReward,
    tokenizer: Any,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> RetokenizationCheck:
    if interaction.model_response is None:
        raise IncompleteInteractionError(f"interaction {interaction.interaction_id} has no model_response")
    prompt = list(interaction.model_response.input_tokens)
    if interaction.is_text_completion:  # no template: the prompt's text encoded as the door encodes it
        text = interaction.messages[0]["content"] if interaction.messages else ""
        rendered = [int(t) for t in tokenizer.encode(text, add_special_tokens=True)]
    else:
        rendered = render_prompt_ids(
            tokenizer,
            interaction.messages,
            tools if tools is not None else interaction.tools,
            chat_template_kwargs if chat_template_kwargs is not None else interaction.chat_template_kwargs,
        )
    first = next((i for i, (a, b) in enumerate(zip(prompt, rendered, strict=False)) if a != b), None)
    if first is None and len(prompt) != len(rendered):
        first = min(len(prompt), len(rendered))
    return RetokenizationCheck(interaction.interaction_id, first is None, first, prompt, rendered)


def check_retokenization_all(
    interactions: dict[str, InteractionWithTokenLogpReward], tokenizer: Any
) -> dict[str, RetokenizationCheck]:
    """`check_retokenization` for every interaction with token data."""
    return {
        k: check_retokenization(v, tokenizer) for k, v in interactions.items() if v.model_response is not None
    }

"""The words every layer uses for the same choices, as `Literal` types.

Config fields, the proxy's request schemas, the capture layer and the trainer all take these,
so a value checked in one place means the same thing everywhere.
"""

from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from .io_struct import InvalidRequestError

# How an episode's interactions become training rows: one row per LLM call, or one row per
# conversation leaf whose prompt reuses its parent's exact tokens.
ExportStyle = Literal["individual", "concat"]
# How rewards flow back through a conversation: along each tree's parent links, or in
# reverse insertion order (the public AReaL implementation).
DiscountMode = Literal["tree", "linear"]
# How messages become prompt tokens: the tokenizer's own chat template, or the concat template
# that keeps a parent's exact tokens as the child's prefix.
ChatTemplateType = Literal["hf", "concat"]

# Which return a generated token trains on: the row's one reward (its leaf's), or the discounted
# return of the turn (call) that generated it.
CreditMode = Literal["leaf", "turn"]
# With turn credit and group normalisation, which turns a turn's return is compared with: the same
# turn index across the group's samples, or every turn of the group's episodes.
CreditNorm = Literal["turn", "episode"]

EXPORT_STYLES: tuple[str, ...] = get_args(ExportStyle)
DISCOUNT_MODES: tuple[str, ...] = get_args(DiscountMode)
CHAT_TEMPLATE_TYPES: tuple[str, ...] = get_args(ChatTemplateType)
CREDIT_MODES: tuple[str, ...] = get_args(CreditMode)
CREDIT_NORMS: tuple[str, ...] = get_args(CreditNorm)


def can_export_concat(chat_template_types: Iterable[str]) -> bool:
    """Whether calls made with these chat template types can be exported in `concat` style."""
    return all(t == "concat" for t in chat_template_types)


def check_export_style(style: str, chat_template_types: Mapping[str, str] | None = None) -> None:
    """The one check of an export style, and of the concat rule, used by every layer.

    `style` must be one of EXPORT_STYLES. Style `concat` trains on one row per conversation
    leaf whose prompt reuses its parent's exact tokens, so it needs calls made with
    chat_template_type `concat`: `chat_template_types` maps each call (or config field) by name
    to the template type it was made with. Raises InvalidRequestError (a ValueError: the
    caller's choice is wrong, HTTP 400 in the proxy) naming the first offender.
    """
    if style not in EXPORT_STYLES:
        raise InvalidRequestError(f"Invalid export style {style!r}; expected one of {EXPORT_STYLES}")
    if style != "concat" or chat_template_types is None:
        return
    wrong = [name for name, kind in chat_template_types.items() if kind != "concat"]
    if wrong:
        raise InvalidRequestError(
            "Cannot export interactions in 'concat' style when interaction.chat_template_type != "
            f"'concat': {len(wrong)} of {len(chat_template_types)} are not (first: {wrong[0]!r}); "
            "a concat row reuses its parent's exact tokens. Generate with "
            "chat_template_type='concat' or export with style='individual'"
        )

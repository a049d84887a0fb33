"""The words every layer uses for the same choices, as `Literal` types.

Config fields, the proxy's request schemas, the capture layer and the trainer all take these,
so a value checked in one place means the same thing everywhere.
"""

from typing import Literal, get_args

# How an episode's interactions become training rows: one row per LLM call, or one row per
# conversation leaf whose prompt reuses its parent's exact tokens.
ExportStyle = Literal["individual", "concat"]
# How rewards flow back through a conversation: along each tree's parent links (the seed), or in
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

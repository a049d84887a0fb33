"""Token-level capture of LLM calls: interactions, conversation trees, rewards, export.

Public names follow AReaL: `from areal_nb.openai import ArealOpenAI,
InteractionWithTokenLogpReward, InteractionCache`.
"""

from .cache import (
    ConversationLinkWarning,
    IncompleteInteractionWarning,
    InteractionCache,
    MissingRewardWarning,
)
from .client import ArealOpenAI, ChunkStream
from .completion import (
    CompletionSettings,
    TokenBudget,
    chat_completion_stream_chunks,
    create_chat_completion,
    resolve_token_budget,
)
from .interaction import InteractionWithTokenLogpReward, TokenRow
from .messages import CompletionRequestError, MessageTypeError, normalize_messages
from .responses import create_response, response_items_to_messages
from .templates import (
    ConcatAlignmentError,
    RetokenizationCheck,
    check_retokenization,
    check_retokenization_all,
    concat_prompt_token_ids_with_parent,
    render_prompt_ids,
)
from .tensors import concat_padded_tensors
from .tool_calls import ParsedToolCall, parse_tool_calls
from .wire import interactions_from_wire, interactions_to_wire

# What users call (AReaL's names first). The other names imported above serve the proxy layer
# and the tests; they stay importable from here but are not the package's interface.
__all__ = [
    "ArealOpenAI",
    "InteractionWithTokenLogpReward",
    "InteractionCache",
    "OpenAIProxyClient",
    "OpenAIProxyWorkflow",
    "CompletionSettings",
    "CompletionRequestError",
    "ConcatAlignmentError",
    "ConversationLinkWarning",
    "IncompleteInteractionWarning",
    "MissingRewardWarning",
    "RetokenizationCheck",
    "check_retokenization",
    "check_retokenization_all",
    "concat_padded_tensors",
]


def __getattr__(name: str):
    # AReaL's public names (`from areal_nb.openai import OpenAIProxyClient, OpenAIProxyWorkflow`)
    # live in the proxy layer, which imports this one; resolve them lazily so the import arrow
    # still points down at import time.
    if name in ("OpenAIProxyClient", "OpenAIProxyWorkflow"):
        from areal_nb import proxy

        return getattr(proxy, name)
    raise AttributeError(f"module 'areal_nb.openai' has no attribute {name!r}")

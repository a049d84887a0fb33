"""The capture layer: token-level records of LLM calls, conversation trees, rewards, export.

What the proxy's routes and `ArealOpenAI` (the direct client) share: a chat completion, a
Responses or an Anthropic Messages call becomes the exact prompt and output tokens, log-probs and
policy versions the engine produced (`InteractionWithTokenLogpReward`), linked into conversation
trees (`InteractionCache`). AReaL's public names are importable from `areal_nb.openai` too.
"""

from .cache import (
    ConversationLinkWarning,
    IncompleteInteractionWarning,
    InteractionCache,
    MissingRewardWarning,
)
from .chat import chat_completion_stream_chunks, create_chat_completion
from .client import ArealOpenAI, ChunkStream
from .interaction import InteractionWithTokenLogpReward, TokenRow
from .messages import CompletionRequestError, MessageTypeError, normalize_messages
from .responses import create_response, response_items_to_messages
from .settings import CompletionSettings, TokenBudget, resolve_token_budget
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

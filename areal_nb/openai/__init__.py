"""AReaL's import path for the capture layer (`areal_nb.capture`) and the proxy workflow.

`from areal_nb.openai import ArealOpenAI, InteractionWithTokenLogpReward, InteractionCache,
OpenAIProxyClient, OpenAIProxyWorkflow` works as it does in AReaL. The modules of the capture
layer keep their old paths too: `areal_nb.openai.cache` *is* `areal_nb.capture.cache` (the same
module object, so classes compare equal and `isinstance` holds across both names). New code
imports `areal_nb.capture`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from areal_nb import capture
from areal_nb.capture import *

for _info in pkgutil.iter_modules(capture.__path__):
    _module = importlib.import_module(f"{capture.__name__}.{_info.name}")
    sys.modules[f"{__name__}.{_info.name}"] = _module  # `import areal_nb.openai.cache` finds it here
    globals()[_info.name] = _module  # and `areal_nb.openai.cache` is an attribute, as for a package

__all__ = [  # AReaL's names first, then the capture layer's other public names
    "ArealOpenAI",
    "CompletionRequestError",
    "CompletionSettings",
    "ConcatAlignmentError",
    "ConversationLinkWarning",
    "IncompleteInteractionWarning",
    "InteractionCache",
    "InteractionWithTokenLogpReward",
    "MissingRewardWarning",
    "OpenAIProxyClient",
    "OpenAIProxyWorkflow",
    "RetokenizationCheck",
    "check_retokenization",
    "check_retokenization_all",
    "concat_padded_tensors",
]


def __getattr__(name: str):
    # Imported when asked for: the proxy client and the rollout workflow pull in httpx and the
    # process pool, which a user of ArealOpenAI alone does not need.
    if name == "OpenAIProxyClient":
        from areal_nb.proxy.client import OpenAIProxyClient

        return OpenAIProxyClient
    if name == "OpenAIProxyWorkflow":
        from areal_nb.rollout.workflow import OpenAIProxyWorkflow

        return OpenAIProxyWorkflow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

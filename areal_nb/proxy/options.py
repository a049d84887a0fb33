"""Request options the engine cannot honour: a 400 that says so, never a silent drop.

A client that asks for structured output, a logit bias, alternatives per token or audio and gets
an ordinary completion back would act on an answer it did not ask for (and the recorded episode
would not be the one its author meant to train on). Options that only change how a reply is
delivered (`seed`, `user`, `parallel_tool_calls`) are accepted as OpenAI's own API accepts them.
Structured output (`json_object`, `json_schema`, a forced or required `tool_choice`, and the
regex / choice options of vLLM and SGLang clients) is accepted: the capture layer turns it into a
constraint the engine decodes under (`capture/structured.py`) and refuses, naming it, a schema
feature the grammar cannot enforce; each token then records the masked distribution it was
sampled from, which the trainer can replay (`actor.replay_sampling_masks`).
"""

from __future__ import annotations

from typing import Any

from .errors import ProxyError
from .schemas import ChatCompletionRequest, CompletionRequest, ResponsesRequest

_FORMATS = "use 'text', 'json_object' or 'json_schema'"
_ONLY_SAMPLED_LOGPROBS = "only the sampled tokens' log-probs are known (logprobs=true gives those)"


def _unsupported(message: str) -> ProxyError:
    return ProxyError(400, message, "unsupported_option")


def _format_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else value


def check_chat_options(body: ChatCompletionRequest) -> None:
    if body.logit_bias:
        raise _unsupported(
            "logit_bias is not supported: the engine samples from the model's own distribution "
            "(whose log-probs training uses); send {} or omit it"
        )
    kind = _format_type(body.response_format)
    if kind not in (None, "text", "json_object", "json_schema"):
        raise _unsupported(f"response_format {kind!r} is not supported: {_FORMATS}")
    if body.best_of not in (None, 1):
        raise _unsupported(f"best_of={body.best_of} is not supported; send separate requests")
    if body.top_logprobs:
        raise _unsupported(f"top_logprobs={body.top_logprobs} is not supported: {_ONLY_SAMPLED_LOGPROBS}")
    extra = body.model_extra or {}
    if extra.get("functions") is not None or extra.get("function_call") is not None:
        raise _unsupported(
            "the legacy functions / function_call parameters are not supported: send the same "
            "functions as tools=[{'type': 'function', 'function': ...}] and tool_choice"
        )
    if extra.get("web_search_options") is not None:
        raise _unsupported(
            "web_search_options is not supported: the proxy serves a local model without web search"
        )
    other = sorted(set(body.modalities or ()) - {"text"})
    if other or body.audio is not None:
        raise _unsupported(
            f"modalities {other or ['audio']} are not supported: the model answers in text only"
        )


def check_responses_options(body: ResponsesRequest) -> None:
    kind = _format_type((body.text or {}).get("format"))
    if kind not in (None, "text", "json_object", "json_schema"):
        raise _unsupported(f"text.format {kind!r} is not supported: {_FORMATS}")
    if body.top_logprobs:
        raise _unsupported(f"top_logprobs={body.top_logprobs} is not supported: {_ONLY_SAMPLED_LOGPROBS}")


def check_completion_options(body: CompletionRequest) -> None:
    if body.logit_bias:
        raise _unsupported(
            "logit_bias is not supported: the engine samples from the model's own distribution "
            "(whose log-probs training uses); send {} or omit it"
        )
    if body.best_of not in (None, 1):
        raise _unsupported(f"best_of={body.best_of} is not supported; send separate requests")
    if body.suffix:
        raise _unsupported("suffix is not supported: the model writes after the prompt only")

"""Request bodies. Unknown fields are allowed everywhere (ignored, never fatal), and the
declared ones give the OpenAPI schema that schemathesis explores.

The schemas check types (a wrong type is a 422); the sampling ranges (temperature, top_p,
top_k, stop strings) are checked once, by `GenerationConfig.check` when the capture layer builds
the engine's config (a 400 `invalid_request`, the same rule `ArealOpenAI` and the engines apply).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from areal_nb.api import DiscountMode, ExportStyle

# Larger than any model context; beyond this a token budget is a mistake, not a request.
_MAX_TOKENS_LIMIT = 2**31 - 1
_ToolChoiceMode = Literal["none", "auto", "required"]


def _json_number(value: Any) -> Any:
    """Only JSON numbers: pydantic's lax mode would read `true` as 1 and `"4"` as 4, so a client
    that sent the wrong type would be served something it did not ask for."""
    if isinstance(value, bool | str):
        # a ValueError, which pydantic wraps into its ValidationError (the proxy's 422)
        raise ValueError(f"expected a number, got {type(value).__name__} {value!r:.40}")
    return value


Number = Annotated[float, BeforeValidator(_json_number)]
Count = Annotated[int, BeforeValidator(_json_number)]  # 4.0 is still 4; 4.5, true and "4" are not
_Flag = StrictBool


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class GrantCapacityRequest(_Body):
    count: Count = Field(1, ge=1, le=1_000_000)


class StartSessionRequest(_Body):
    # no control characters: the id names the session in logs and errors, where a newline forges lines
    task_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")
    # 8-512 visible ASCII characters (inner spaces allowed); other keys → 400 (state.py)
    api_key: str | None = Field(None, min_length=8, max_length=512)


class StartSessionResponse(BaseModel):
    session_id: str
    api_key: str


class SetRewardRequest(_Body):
    interaction_id: str | None = None
    reward: Number = Field(allow_inf_nan=False)
    # the agent (the `model` its calls sent) whose most recently completed call takes the reward;
    # with neither this nor interaction_id: the session's most recently completed call
    agent: str | None = None


class ExportTrajectoriesRequest(_Body):
    session_id: str
    discount: Number = Field(1.0, ge=0.0, le=1.0)
    style: ExportStyle = "individual"
    discount_mode: DiscountMode = "tree"
    # seconds to wait for end_session; None → the server's export_wait_timeout
    wait_timeout: Number | None = Field(None, gt=0, le=86_400)


class ChatCompletionRequest(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    stream: _Flag | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoiceMode | dict[str, Any] | None = None
    temperature: Number | None = Field(None, allow_inf_nan=False)  # range: GenerationConfig.check
    top_p: Number | None = Field(None, allow_inf_nan=False)
    max_tokens: Count | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    max_completion_tokens: Count | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    max_total_tokens: Count | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    stop: str | list[str] | None = None
    store: _Flag | None = None
    n: Count | None = Field(None, ge=1)  # at most MAX_CHOICES (16): a 400 from the capture layer
    metadata: dict[str, Any] | None = None
    # accepted by the schema so that a non-zero value gets a 400 "not supported", not silence
    frequency_penalty: Number | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: Number | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    extra_body: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # typed so a wrong type is a 422; `proxy/options.py` refuses the values the engine cannot honour
    seed: Count | None = None  # best effort in OpenAI's API too: accepted, not reproduced
    user: str | None = None
    parallel_tool_calls: _Flag | None = None
    logprobs: _Flag | None = None
    top_logprobs: Count | None = Field(None, ge=0, le=20)
    best_of: Count | None = Field(None, ge=1)
    logit_bias: dict[str, Number] | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    top_k: Count | None = None  # vLLM/SGLang's extra sampling parameter: ≥ 1, or -1 for no limit


class CompletionRequest(_Body):
    """OpenAI's legacy text completions; the prompt's forms (a string, token ids, a list of
    either) are checked by the capture layer."""

    prompt: str | list[Any]
    model: str | None = None
    stream: _Flag | None = None
    stream_options: dict[str, Any] | None = None
    max_tokens: Count | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    temperature: Number | None = Field(None, allow_inf_nan=False)  # range: GenerationConfig.check
    top_p: Number | None = Field(None, allow_inf_nan=False)
    stop: str | list[str] | None = None
    logprobs: Count | None = Field(None, ge=0)  # only 0 is served: a 400 from the capture layer
    echo: _Flag | None = None
    n: Count | None = Field(None, ge=1)
    store: _Flag | None = None
    seed: Count | None = None  # best effort in OpenAI's API too: accepted, not reproduced
    user: str | None = None
    frequency_penalty: Number | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: Number | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    best_of: Count | None = Field(None, ge=1)
    logit_bias: dict[str, Number] | None = None
    suffix: str | None = None
    top_k: Count | None = None  # vLLM/SGLang's extra sampling parameter: ≥ 1, or -1 for no limit


class ResponsesRequest(_Body):
    input: str | list[dict[str, Any]]
    model: str | None = None
    stream: _Flag | None = None
    instructions: str | None = None
    previous_response_id: str | None = None  # a response of the same session
    conversation: str | dict[str, Any] | None = None  # declared to be refused clearly (400)
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoiceMode | dict[str, Any] | None = None
    temperature: Number | None = Field(None, allow_inf_nan=False)  # range: GenerationConfig.check
    top_p: Number | None = Field(None, allow_inf_nan=False)
    max_output_tokens: Count | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    extra_body: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    store: _Flag | None = None
    parallel_tool_calls: _Flag | None = None
    top_logprobs: Count | None = Field(None, ge=0, le=20)
    text: dict[str, Any] | None = None


class MessagesRequest(_Body):
    """Anthropic Messages. Content blocks are checked by the converter (clear 400s)."""

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: Count = Field(ge=1, le=_MAX_TOKENS_LIMIT)
    system: str | list[dict[str, Any]] | None = None
    stream: _Flag | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: Number | None = Field(None, allow_inf_nan=False)  # range: GenerationConfig.check
    top_p: Number | None = Field(None, allow_inf_nan=False)
    stop_sequences: list[str] | None = None
    top_k: Count | None = None  # ≥ 1; honoured by the engine
    # not Anthropic's: OpenAI's flag, which harnesses relaying one sampling to every API send here
    # too (verifiers' untrainable seats): answered, not recorded
    store: _Flag | None = None


class CountTokensRequest(_Body):
    """Anthropic's `/v1/messages/count_tokens`: a Messages body without `max_tokens`."""

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class TokenizeRequest(_Body):
    """vLLM's `/tokenize`: a plain `prompt`, or `messages` rendered as the chat door renders them."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = Field(None, min_length=1)
    # vLLM's defaults: True for a prompt (a BOS where the tokenizer has one), False for messages
    add_special_tokens: _Flag | None = None
    add_generation_prompt: _Flag = True
    continue_final_message: _Flag = False  # declared to be refused clearly (400)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: _Flag = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[Count]

"""The proxy's generation routes, one per door: `/v1/chat/completions`, `/v1/responses`,
`/v1/completions` (each also without `/v1`) and Anthropic's `/v1/messages`.

Each checks the options the engine cannot honour (`options.py`), calls its capture-layer door
on the session the key names (409 once it has ended), and answers in the door's dialect: JSON,
or the recorded reply replayed as server-sent events. `chat_completion_response` and
`text_completion_response` also answer the app's in-process direct lane (`app.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.datastructures import State

from areal_nb.capture.anthropic import (
    AnthropicRequestError,
    anthropic_request_to_chat,
    anthropic_stream_events,
    chat_completion_to_anthropic,
    format_sse,
    tool_arguments_of,
)
from areal_nb.capture.chat import chat_completion_stream_chunks, create_chat_completion
from areal_nb.capture.response_stream import format_response_sse, response_stream_events
from areal_nb.capture.responses import create_response
from areal_nb.capture.structured import GUIDED_KEYS
from areal_nb.capture.text_completion import create_text_completion, text_completion_stream_chunks

from .dependencies import OpenSession, capture_kwargs, generate
from .errors import ProxyError
from .options import check_chat_options, check_completion_options, check_responses_options
from .schemas import ChatCompletionRequest, CompletionRequest, MessagesRequest, ResponsesRequest
from .state import SessionData

_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}

router = APIRouter()


def _extra_body_of(body: ChatCompletionRequest | ResponsesRequest) -> dict[str, Any] | None:
    """The server-specific options: a literal `extra_body` object, `chat_template_kwargs`, and the
    regex / choice / JSON options of vLLM and SGLang, which the OpenAI SDK's `extra_body=` puts at
    the top level of the body."""
    extra = dict(body.extra_body or {})
    if body.chat_template_kwargs is not None:
        extra.setdefault("chat_template_kwargs", body.chat_template_kwargs)
    top_level = body.model_extra or {}
    for key in GUIDED_KEYS:
        if top_level.get(key) is not None:
            extra.setdefault(key, top_level[key])
    return extra or None


async def chat_completions(body: ChatCompletionRequest, request: Request, session: OpenSession) -> Response:
    return await chat_completion_response(request.app.state, body, session, request)


# The request fields the capture layer takes under the same names, per door.
_CHAT_FIELDS = (
    "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "max_total_tokens", "stop", "store", "n", "metadata", "frequency_penalty", "presence_penalty",
    "logprobs", "top_k", "response_format",
    "model",  # names the agent that made the call
)  # fmt: skip
_TEXT_FIELDS = (
    "prompt", "max_tokens", "temperature", "top_p", "stop", "logprobs", "echo", "n", "store",
    "frequency_penalty", "presence_penalty", "top_k", "model",
)  # fmt: skip


M = TypeVar("M", bound=BaseModel)


def _fields(body: BaseModel, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(body, name) for name in names}


async def chat_completion_response(
    state: State, body: ChatCompletionRequest, session: SessionData, request: Request | None = None
) -> Response:
    """`/v1/chat/completions`' answer for `body` on `session` (the route's and the direct lane's)."""
    check_chat_options(body)
    completion = await generate(
        create_chat_completion(
            **capture_kwargs(state, session), **_fields(body, _CHAT_FIELDS), extra_body=_extra_body_of(body)
        ),
        request,
    )
    return _openai_reply(completion, body.stream, chat_completion_stream_chunks)


def _openai_reply(completion: M, stream: bool | None, chunks: Callable[[M], Iterable[BaseModel]]) -> Response:
    """The completion as JSON, or replayed as OpenAI's server-sent events ended by `[DONE]`.

    Generation is complete before the first byte, so the whole stream is sent at once; an
    error is then a proper status code instead of a broken stream."""
    if stream:
        text = "".join(f"data: {chunk.model_dump_json()}\n\n" for chunk in chunks(completion))
        return Response(text + "data: [DONE]\n\n", media_type="text/event-stream", headers=_SSE_HEADERS)
    return Response(completion.model_dump_json(), media_type="application/json")


async def completions(body: CompletionRequest, request: Request, session: OpenSession) -> Response:
    return await text_completion_response(request.app.state, body, session, request)


async def text_completion_response(
    state: State, body: CompletionRequest, session: SessionData, request: Request | None = None
) -> Response:
    """`/v1/completions`' answer for `body` on `session` (the route's and the direct lane's)."""
    check_completion_options(body)
    completion = await generate(
        create_text_completion(**capture_kwargs(state, session), **_fields(body, _TEXT_FIELDS)), request
    )
    return _openai_reply(completion, body.stream, text_completion_stream_chunks)


async def responses(body: ResponsesRequest, request: Request, session: OpenSession) -> Response:
    check_responses_options(body)
    response = await generate(
        create_response(
            **capture_kwargs(request.app.state, session),
            input=body.input,
            instructions=body.instructions,
            tools=body.tools,
            tool_choice=body.tool_choice,
            temperature=body.temperature,
            top_p=body.top_p,
            max_output_tokens=body.max_output_tokens,
            metadata=body.metadata,
            include=body.include,
            previous_response_id=body.previous_response_id,
            conversation=body.conversation,
            text=body.text,
            store=body.store,
            model=body.model,
            extra_body=_extra_body_of(body),
        ),
        request,
    )
    if body.stream:  # generated already: the events replay the recorded response
        return Response(
            format_response_sse(response_stream_events(response)),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    return Response(response.model_dump_json(), media_type="application/json")


for _prefix in ("/v1", ""):  # SDKs differ in where `/v1` goes
    router.add_api_route(
        f"{_prefix}/chat/completions", chat_completions, methods=["POST"], include_in_schema=bool(_prefix)
    )
    router.add_api_route(f"{_prefix}/responses", responses, methods=["POST"], include_in_schema=bool(_prefix))
    router.add_api_route(
        f"{_prefix}/completions", completions, methods=["POST"], include_in_schema=bool(_prefix)
    )


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request, session: OpenSession) -> Response:
    try:
        chat_kwargs = anthropic_request_to_chat(body.model_dump(), session.tool_arguments)
    except AnthropicRequestError as exc:
        raise ProxyError(400, f"invalid Anthropic request: {exc}", "invalid_request") from exc
    completion = await generate(
        create_chat_completion(
            **capture_kwargs(request.app.state, session), **chat_kwargs, model=body.model, store=body.store
        ),
        request,
    )
    session.tool_arguments.update(tool_arguments_of(completion))
    message = chat_completion_to_anthropic(completion, model=body.model)
    if body.stream:
        return Response(
            format_sse(anthropic_stream_events(message)), media_type="text/event-stream", headers=_SSE_HEADERS
        )
    return JSONResponse(message)

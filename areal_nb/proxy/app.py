"""`create_app(engine, tokenizer, settings)`: the proxy as a FastAPI app.

The routes are module-level handlers; everything an app serves lives on its `app.state`: the
sessions (`proxy`, a `ProxyState`), `engine`, `tokenizer`, the capture layer's `completion`
settings and the body limit. Build as many apps per process as you like. Endpoints, keys and
status codes follow AReaL's (docs/reference/areal-semantics.md, "The proxy"), with these
deliberate differences:

- every OpenAI route also exists without `/v1` (SDKs differ in where `/v1` goes);
- `/export_trajectories` waits for `end_session` at most `export_wait_timeout` seconds
  (504 after that; the session stays exportable), never forever;
- chat calls after `/rl/end_session` answer 409 "session ended": the episode is closed, so
  nothing more is recorded into it (rewards may still be set until export);
- keys of exported or expired sessions answer 410 (not 401), so a late agent call says why;
- unknown body fields are ignored, except that `chat_template_kwargs` at the top level (where
  the OpenAI SDK merges `extra_body`) is forwarded, not dropped;
- errors are OpenAI-style JSON everywhere except `/v1/messages` (Anthropic style);
- only `InvalidRequestError` (input validation in the capture layer and the engine) becomes a
  400; any other exception is our fault: 500 with a logged traceback. The body is checked
  before any route parses it (`limits.py`: size, JSON depth, lone surrogates), and the limits
  that follow from the model's context before the template is rendered (docs/guides/limits.md);
- an export removes its session only once the response was sent: a failed, cancelled or
  abandoned export leaves the session exportable with the same result.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException

from areal_nb.api import InferenceEngine, InvalidRequestError
from areal_nb.capture.anthropic import (
    AnthropicRequestError,
    anthropic_request_to_chat,
    anthropic_stream_events,
    chat_completion_to_anthropic,
    format_sse,
    tool_arguments_of,
)
from areal_nb.capture.cache import InteractionCache
from areal_nb.capture.chat import chat_completion_stream_chunks, chat_prompt_ids, create_chat_completion
from areal_nb.capture.request_limits import context_tokens, max_chars_per_token
from areal_nb.capture.response_stream import format_response_sse, response_stream_events
from areal_nb.capture.responses import create_response
from areal_nb.capture.settings import CompletionSettings
from areal_nb.capture.structured import GUIDED_KEYS
from areal_nb.capture.text_completion import create_text_completion, text_completion_stream_chunks
from areal_nb.capture.tokens import check_text_fits, check_token_ids, decode_ids, encode_text, token_strings
from areal_nb.errors import ContextLengthExceeded, HTTPError
from areal_nb.serving import ClientGone, bearer_token_of, error_json, unless_client_leaves

from .errors import ProxyError, describe_validation_errors, error_response, http_error_response
from .export import discounted_calls
from .limits import THREAD_BYTES, BodyLimitMiddleware, body_limit, body_problem
from .logs import RepeatFilter
from .model_cards import model_card, model_list
from .options import check_chat_options, check_completion_options, check_responses_options
from .schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    CountTokensRequest,
    DetokenizeRequest,
    ExportTrajectoriesRequest,
    GrantCapacityRequest,
    MessagesRequest,
    ResponsesRequest,
    SetRewardRequest,
    StartSessionRequest,
    StartSessionResponse,
    TokenizeRequest,
)
from .settings import ProxySettings
from .state import ProxyState, SessionData

logger = logging.getLogger(__name__)
logger.addFilter(RepeatFilter())  # one traceback per kind of failure per 10 s, not per request

T = TypeVar("T")

_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}

# A route of `app.state.direct_routes`: `await route(path, body, headers)` answers a request the
# way the app would, or returns None when only the full ASGI stack can (see `_direct_route`).
_DirectRoute = Callable[[str, bytes, Mapping[str, str]], Awaitable["Response | None"]]


def create_app(engine: InferenceEngine, tokenizer: Any, settings: ProxySettings | None = None) -> FastAPI:
    """A proxy app serving `engine` (any `InferenceEngine`) through `tokenizer`'s chat template."""
    settings = settings or ProxySettings()
    app = FastAPI(title="areal_nb proxy", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.proxy = ProxyState(settings, InteractionCache)
    app.state.settings = settings
    app.state.engine = engine
    app.state.tokenizer = tokenizer
    app.state.completion = settings.completion if settings.completion is not None else CompletionSettings()
    context = context_tokens(engine, None)
    max_body = body_limit(
        settings.max_body_bytes, context, max_chars_per_token(tokenizer) if context else None
    )
    app.state.max_body_bytes = max_body
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body, body_timeout=settings.body_timeout)

    app.add_exception_handler(HTTPError, _http_error_of_ours)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(router)
    app.state.direct_routes = {
        f"{prefix}{path}": functools.partial(_direct_route, schema, respond, app.state)
        for prefix in ("/v1", "")
        for path, schema, respond in (
            ("/chat/completions", ChatCompletionRequest, _chat_completion_response),
            ("/completions", CompletionRequest, _text_completion_response),
        )
    }
    return app


# ---------------------------------------------------------------------- error dialects
# (Starlette types a handler's exception as Exception; each is registered for the type it narrows to)


async def _http_error_of_ours(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPError)
    return http_error_response(request.url.path, exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(request.url.path, 422, describe_validation_errors(exc.errors()), "validation_error")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    response = error_response(request.url.path, exc.status_code, str(exc.detail), None)
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


# ---------------------------------------------------------------------- auth dependencies
# async on purpose: FastAPI runs plain-def dependencies in a thread pool (two thread hops per
# call), and these never block.
def _bearer_token(request: Request) -> str | None:
    """The key from `Authorization: Bearer <t>` or, for the Anthropic SDK, `x-api-key`."""
    return bearer_token_of(request.headers)


async def admin(request: Request) -> None:
    request.app.state.proxy.check_admin(_bearer_token(request))


async def session_key(request: Request) -> SessionData:
    return request.app.state.proxy.session_for_key(_bearer_token(request))


_KeyedSession = Annotated[SessionData, Depends(session_key)]  # the session the caller's key names


async def _open_session(session: _KeyedSession) -> SessionData:
    return _check_open(session)


_OpenSession = Annotated[SessionData, Depends(_open_session)]  # ... that has not ended (409 otherwise)


def _check_open(session: SessionData) -> SessionData:
    if session.ended:
        raise ProxyError(
            409,
            f"session {session.session_id!r} has ended (/rl/end_session was called); "
            "no more calls are recorded into it",
            "session_ended",
        )
    return session


# ---------------------------------------------------------------------- calling the capture layer
async def generate(call: Awaitable[T], request: Request | None = None) -> T:
    """Await a capture-layer call, turning its failures into clear HTTP errors; with `request`,
    the call is cancelled if the client goes away first (`unless_client_leaves`)."""
    try:
        return await (call if request is None else unless_client_leaves(call, request.receive))
    except ClientGone:  # nobody is left to read this answer
        raise ProxyError(
            408, "the client went away before the reply was ready; nothing was recorded", "client_gone"
        ) from None
    except HTTPError:  # input errors (InvalidRequestError: 400 invalid_request) and our own answers
        raise
    except Exception as exc:  # our own or the engine's fault: 500 with a traceback, keep serving
        logger.exception("generation failed")
        raise ProxyError(500, f"generation failed: {type(exc).__name__}: {exc}", "generation_failed") from exc


def _capture_kwargs(state: State, session: SessionData) -> dict[str, Any]:
    return {
        "engine": state.engine,
        "tokenizer": state.tokenizer,
        "settings": state.completion,
        "cache": session.cache,
    }


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


router = APIRouter()


# ---------------------------------------------------------------------- public info
@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    state: ProxyState = request.app.state.proxy
    return {
        "status": "ok",
        "initialized": True,
        "active_sessions": len(state.sessions),
        "capacity": state.capacity,
    }


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def models(request: Request) -> dict[str, Any]:
    state = request.app.state
    return model_list(
        state.settings.model_name, context_tokens(state.engine, state.completion.engine_max_tokens)
    )


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def model(model_id: str, request: Request) -> dict[str, Any]:
    """Any name: a request's `model` names the agent that calls, and every name is served."""
    state = request.app.state
    return model_card(model_id, context_tokens(state.engine, state.completion.engine_max_tokens))


# ---------------------------------------------------------------------- admin endpoints
@router.post("/grant_capacity", dependencies=[Depends(admin)])
async def grant_capacity(request: Request, body: GrantCapacityRequest | None = None) -> dict[str, int]:
    return {"capacity": request.app.state.proxy.grant_capacity(body.count if body is not None else 1)}


@router.post("/rl/start_session", dependencies=[Depends(admin)], response_model=StartSessionResponse)
async def start_session(body: StartSessionRequest, request: Request) -> StartSessionResponse:
    session = request.app.state.proxy.start_session(body.task_id, body.api_key)
    return StartSessionResponse(session_id=session.session_id, api_key=session.api_key)


@router.post("/export_trajectories", dependencies=[Depends(admin)])
async def export_trajectories(body: ExportTrajectoriesRequest, request: Request) -> Response:
    """One-shot export. The session is removed only once its data was handed to the client:
    a failed, cancelled or abandoned export leaves it exportable, with the same result."""
    state: ProxyState = request.app.state.proxy
    session = state.get_session(body.session_id)
    timeout = (
        body.wait_timeout if body.wait_timeout is not None else request.app.state.settings.export_wait_timeout
    )
    if not await session.wait_ended(timeout, gave_up=request.is_disconnected):
        if await request.is_disconnected():
            raise ProxyError(
                408, "the client went away while the export waited; the session is kept", "client_gone"
            )
        raise ProxyError(
            504,
            f"session {body.session_id!r} did not end within {timeout:g} s: the agent side must call "
            "/rl/end_session before its trajectories can be exported (the session is kept; retry)",
            "export_timeout",
        )
    while not state.claim_export(session):  # another export holds it: wait for its outcome
        if await request.is_disconnected():
            raise ProxyError(
                408, "the client went away while the export waited; the session is kept", "client_gone"
            )
        await asyncio.sleep(0.02)

    def give_back() -> None:  # the export did not reach anyone: keep the session exportable
        session.cache.undo_reward_discount()
        state.release_export(session)

    work = asyncio.ensure_future(asyncio.to_thread(_export_json, session, body))
    try:
        payload = await asyncio.shield(work)
    except asyncio.CancelledError:  # the thread runs on: give the session back once it is done
        work.add_done_callback(lambda _: give_back())
        raise
    except InvalidRequestError as exc:
        give_back()
        raise ProxyError(400, f"cannot export session {body.session_id!r}: {exc}", "export_failed") from exc
    except Exception as exc:
        give_back()
        logger.exception("export of session %r failed", body.session_id)
        raise ProxyError(
            500, f"export failed: {type(exc).__name__}: {exc} (the session is kept)", "export_failed"
        ) from exc
    if await request.is_disconnected():
        give_back()
        raise ProxyError(
            408, "the client went away before the export was sent; the session is kept", "client_gone"
        )
    return _HandOver(
        payload, on_sent=lambda: state.remove_session(session, "was exported"), on_failed=give_back
    )


def _export_json(session: SessionData, body: ExportTrajectoriesRequest) -> bytes:
    interactions = discounted_calls(session, body.discount, body.style, body.discount_mode)
    wire = {iid: interaction.to_wire() for iid, interaction in interactions.items()}
    return json.dumps(
        {"session_id": session.session_id, "interactions": wire}, ensure_ascii=False, allow_nan=False
    ).encode()


# ---------------------------------------------------------------------- session endpoints
@router.post("/rl/end_session")
async def end_session(request: Request, session: _KeyedSession) -> dict[str, Any]:
    count = request.app.state.proxy.end_session(session)
    return {"message": "success", "session_id": session.session_id, "interaction_count": count}


@router.post("/rl/set_reward")
async def set_reward(body: SetRewardRequest, session: _KeyedSession) -> dict[str, Any]:
    cache = session.cache
    if body.agent is not None and body.interaction_id is not None:
        raise ProxyError(400, "set_reward takes interaction_id or agent, not both", "invalid_request")
    if body.agent is not None:
        session.set_agent_reward(body.agent, body.reward)
    elif body.interaction_id is None:
        session.set_last_reward(body.reward)
    else:
        try:
            cache.set_reward(body.interaction_id, body.reward)
        except KeyError:
            raise ProxyError(
                400,
                f"interaction {body.interaction_id!r} not found in session {session.session_id!r}",
                "unknown_interaction",
            ) from None
    return {"message": "success"}


# ---------------------------------------------------------------------- generation endpoints
async def chat_completions(body: ChatCompletionRequest, request: Request, session: _OpenSession) -> Response:
    return await _chat_completion_response(request.app.state, body, session, request)


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


async def _chat_completion_response(
    state: State, body: ChatCompletionRequest, session: SessionData, request: Request | None = None
) -> Response:
    check_chat_options(body)
    completion = await generate(
        create_chat_completion(
            **_capture_kwargs(state, session), **_fields(body, _CHAT_FIELDS), extra_body=_extra_body_of(body)
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


async def completions(body: CompletionRequest, request: Request, session: _OpenSession) -> Response:
    return await _text_completion_response(request.app.state, body, session, request)


async def _text_completion_response(
    state: State, body: CompletionRequest, session: SessionData, request: Request | None = None
) -> Response:
    check_completion_options(body)
    completion = await generate(
        create_text_completion(**_capture_kwargs(state, session), **_fields(body, _TEXT_FIELDS)), request
    )
    return _openai_reply(completion, body.stream, text_completion_stream_chunks)


async def responses(body: ResponsesRequest, request: Request, session: _OpenSession) -> Response:
    check_responses_options(body)
    response = await generate(
        create_response(
            **_capture_kwargs(request.app.state, session),
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
async def messages(body: MessagesRequest, request: Request, session: _OpenSession) -> Response:
    try:
        chat_kwargs = anthropic_request_to_chat(body.model_dump(), session.tool_arguments)
    except AnthropicRequestError as exc:
        raise ProxyError(400, f"invalid Anthropic request: {exc}", "invalid_request") from exc
    completion = await generate(
        create_chat_completion(
            **_capture_kwargs(request.app.state, session), **chat_kwargs, model=body.model, store=body.store
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


# ---------------------------------------------------------------------- counting (nothing generated or recorded)
@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, session: _KeyedSession) -> dict[str, int]:
    """Anthropic's token count: the prompt `/v1/messages` would send the engine for this body
    now (same conversion and rendering, the session's concat parent included)."""
    try:
        chat_kwargs = anthropic_request_to_chat(body.model_dump(), session.tool_arguments)
    except AnthropicRequestError as exc:
        raise ProxyError(400, f"invalid Anthropic request: {exc}", "invalid_request") from exc
    prompt = await generate(
        chat_prompt_ids(**_capture_kwargs(request.app.state, session), **chat_kwargs, model=body.model),
        request,
    )
    return {"input_tokens": len(prompt)}


@router.post("/tokenize", response_model=None)
async def tokenize(
    body: TokenizeRequest, request: Request, session: _KeyedSession
) -> dict[str, Any] | JSONResponse:
    """vLLM's `/tokenize`: a `prompt` as `/v1/completions` encodes it, or `messages` as
    `/v1/chat/completions` renders them (tools, template variables, the concat parent)."""
    state = request.app.state
    if (body.prompt is None) == (body.messages is None):
        raise ProxyError(
            400, "send either prompt (a string) or messages (a list), not both", "invalid_request"
        )
    if body.messages is None:
        text = body.prompt or ""
        try:
            check_text_fits(
                text,
                state.tokenizer,
                context_tokens(state.engine, state.completion.engine_max_tokens),
                "prompt",
            )
        except ContextLengthExceeded as overflow:  # a prompt's overflow, as /v1/completions words it
            return error_json(overflow, "completions")
        ids = await encode_text(state.tokenizer, text, body.add_special_tokens is not False)
    else:
        if body.continue_final_message:
            raise ProxyError(
                400,
                "continue_final_message is not supported: the chat door never continues a message",
                "unsupported_option",
            )
        if body.add_special_tokens:
            raise ProxyError(
                400,
                "add_special_tokens=true is not supported with messages: the chat template places "
                "the special tokens (the chat door adds none)",
                "unsupported_option",
            )
        extra = {"chat_template_kwargs": body.chat_template_kwargs} if body.chat_template_kwargs else None
        ids = await generate(
            chat_prompt_ids(
                **_capture_kwargs(state, session),
                messages=body.messages,
                tools=body.tools,
                extra_body=extra,
                model=body.model,
                add_generation_prompt=body.add_generation_prompt,
            ),
            request,
        )
    return {
        "count": len(ids),
        "max_model_len": context_tokens(state.engine, state.completion.engine_max_tokens),
        "tokens": ids,
        "token_strs": token_strings(state.tokenizer, ids) if body.return_token_strs else None,
    }


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request, session: _KeyedSession) -> dict[str, str]:
    """vLLM's `/detokenize`: the text of token ids, special tokens included."""
    tokenizer = request.app.state.tokenizer
    return {"prompt": decode_ids(tokenizer, check_token_ids(body.tokens, tokenizer, "tokens"))}


# ---------------------------------------------------------------------- the direct lane
async def _direct_route(
    schema: type[ChatCompletionRequest] | type[CompletionRequest],
    respond: Callable[..., Awaitable[Response]],
    state: State,
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
) -> Response | None:
    """A generating route (`/v1/chat/completions`, `/v1/completions`) for callers in this
    process (`proxy.inprocess`), without the ASGI stack: the same body checks, model, key check
    and handler as the route, so the same answer, at a fifth of the cost per call (middleware,
    routing and dependency solving were most of what an in-process call cost). Whatever is
    unusual — a body the middleware or the model would refuse, a non-JSON content type, a large
    body — returns None before anything happened, and the caller sends the request through the
    full stack, which answers it: the lane never has to reproduce an error it did not raise
    itself. `create_app` binds `schema`, `respond` (the route's handler) and `state` (the app's),
    giving a `_DirectRoute`."""
    content_type = headers.get("content-type")
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None
    if not raw or len(raw) > min(state.max_body_bytes, THREAD_BYTES) or body_problem(raw) is not None:
        return None
    try:
        body = schema.model_validate(json.loads(raw))
    except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
        return None
    try:
        return await respond(state, body, _check_open(state.proxy.session_for_key(bearer_token_of(headers))))
    except HTTPError as exc:
        return http_error_response(path, exc)
    except Exception:  # what Starlette's ServerErrorMiddleware answers (and logs) for a bug
        logger.exception("%s failed", path)
        return PlainTextResponse("Internal Server Error", status_code=500)


class _HandOver(Response):
    """A JSON response that reports whether it was sent (export hands a session over)."""

    media_type = "application/json"

    def __init__(self, content: bytes, *, on_sent: Callable[[], Any], on_failed: Callable[[], Any]) -> None:
        super().__init__(content)
        self._on_sent, self._on_failed = on_sent, on_failed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            self._on_failed()
            raise
        self._on_sent()

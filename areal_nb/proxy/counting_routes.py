"""The proxy's counting routes: nothing is generated or recorded.

Anthropic's `/v1/messages/count_tokens` and vLLM's `/tokenize` render a body exactly as its
generating door would (same conversion and template, the session's concat parent included);
`/detokenize` turns token ids back into text.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from areal_nb.capture.anthropic import AnthropicRequestError, anthropic_request_to_chat
from areal_nb.capture.chat import chat_prompt_ids
from areal_nb.capture.request_limits import context_tokens
from areal_nb.capture.tokens import check_text_fits, check_token_ids, decode_ids, encode_text, token_strings
from areal_nb.errors import ContextLengthExceeded
from areal_nb.serving import error_json

from .dependencies import KeyedSession, capture_backend, generate
from .errors import ProxyError
from .schemas import CountTokensRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, session: KeyedSession) -> dict[str, int]:
    """Anthropic's token count: the prompt `/v1/messages` would send the engine for this body
    now (same conversion and rendering, the session's concat parent included)."""
    try:
        chat_kwargs = anthropic_request_to_chat(body.model_dump(), session.tool_arguments)
    except AnthropicRequestError as exc:
        raise ProxyError(400, f"invalid Anthropic request: {exc}", "invalid_request") from exc
    prompt = await generate(
        chat_prompt_ids(capture_backend(request.app.state, session), **chat_kwargs, model=body.model),
        request,
    )
    return {"input_tokens": len(prompt)}


@router.post("/tokenize", response_model=None)
async def tokenize(
    body: TokenizeRequest, request: Request, session: KeyedSession
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
                capture_backend(state, session),
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
async def detokenize(body: DetokenizeRequest, request: Request, session: KeyedSession) -> dict[str, str]:
    """vLLM's `/detokenize`: the text of token ids, special tokens included."""
    tokenizer = request.app.state.tokenizer
    return {"prompt": decode_ids(tokenizer, check_token_ids(body.tokens, tokenizer, "tokens"))}

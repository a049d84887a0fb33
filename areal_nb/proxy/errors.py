"""The proxy's error dialects: OpenAI on every route, Anthropic on /v1/messages, and the own
words (same shape as OpenAI's) of the Responses API on /v1/responses and of OpenAI's legacy
text completions on /v1/completions.

The bodies come from `areal_nb.errors.render_error` (through `areal_nb.serving.error_json`); this
module only picks the dialect a path speaks.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from areal_nb.errors import Dialect, HTTPError, ProxyError
from areal_nb.serving.errors import error_json

_ANTHROPIC_PATHS = ("/v1/messages",)


def _is_anthropic_path(path: str) -> bool:
    return path.startswith(_ANTHROPIC_PATHS)


_RESPONSES_PATHS = ("/v1/responses", "/responses")
_COMPLETIONS_PATHS = frozenset({"/v1/completions", "/completions"})


def _dialect_of(path: str) -> Dialect:
    if _is_anthropic_path(path):
        return "anthropic"
    if path.rstrip("/") in _COMPLETIONS_PATHS:
        return "completions"
    return "responses" if path.startswith(_RESPONSES_PATHS) else "openai"


def http_error_response(path: str, error: HTTPError) -> JSONResponse:
    """`error` answered in the dialect of the route at `path`."""
    return error_json(error, _dialect_of(path))


def error_response(path: str, status: int, message: str, code: str | None = None) -> JSONResponse:
    return http_error_response(path, ProxyError(status, message, code))


def describe_validation_errors(errors: Any) -> str:
    """One line per pydantic error: `body.messages: Field required`."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts) if parts else "invalid request"

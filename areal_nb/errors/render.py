"""`render_error(error, dialect)`: the one place an `HTTPError` becomes a reply body, in the dialect
of the door that was called (the shapes are in `areal_nb.errors`' docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .http import DIALECTS, Dialect, HTTPError
from .usage import InvalidArgumentError

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
}
# The OpenAI and Anthropic SDKs retry 408/409/429/5xx unless told otherwise; these answers will
# not change on retry.
_NO_RETRY = frozenset({400, 401, 403, 404, 409, 410, 413, 422})


@dataclass(frozen=True)
class ErrorReply:
    """What a server sends for an error: status, JSON body and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def render_error(error: HTTPError, dialect: Dialect) -> ErrorReply:
    """`error` as `dialect`'s client expects it (`areal_nb.errors`' docstring shows the shapes)."""
    if dialect not in DIALECTS:
        raise InvalidArgumentError(f"unknown error dialect {dialect!r}; expected one of {DIALECTS}")
    status, message = error.status, error.message_in(dialect)
    if dialect == "sglang":
        # SGLang's API types' ErrorBody, which its clients decode (SGLang's own /generate sends a
        # schema violation as a bare {"error": "..."}; SGLangEngine reads both)
        return ErrorReply(status, {"error": {"message": message, "code": status}})
    headers = {"x-should-retry": "false"} if status in _NO_RETRY else {}
    if error.retry_after is not None:  # the OpenAI and Anthropic SDKs wait this long before retrying
        headers["retry-after"] = str(error.retry_after)
    if dialect == "anthropic":
        body = {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"), "message": message},
        }
    else:  # "openai", "completions", "responses"
        body = {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                "param": error.param_in(dialect),
                "code": error.code,
            }
        }
    return ErrorReply(status, body, headers)

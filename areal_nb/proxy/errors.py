"""`ProxyError` and the two error-body dialects: OpenAI on every route, Anthropic on /v1/messages."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

ANTHROPIC_PATHS = ("/v1/messages",)

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
}
# The SDKs retry 408/409/429/5xx unless told otherwise; these answers will not change on retry.
_NO_RETRY = frozenset({400, 401, 403, 404, 409, 410, 413, 422})


class ProxyError(Exception):
    """An HTTP error with a clear message; `code` is a short machine-readable tag."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def is_anthropic_path(path: str) -> bool:
    return path.startswith(ANTHROPIC_PATHS)


def error_response(path: str, status: int, message: str, code: str | None = None) -> JSONResponse:
    headers = {"x-should-retry": "false"} if status in _NO_RETRY else None
    if is_anthropic_path(path):
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"), "message": message},
        }
    else:
        body = {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                "code": code,
            }
        }
    return JSONResponse(body, status_code=status, headers=headers)


def describe_validation_errors(errors: Any) -> str:
    """One line per pydantic error: `body.messages: Field required`."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts) if parts else "invalid request"

"""`RequestError`'s kinds besides the HTTP answers: a body or client that broke off on the server
side, a proxy that failed to start or answered its client an error.
"""

from __future__ import annotations

from .families import RequestError


class ClientGone(RequestError):
    """The client disconnected before the reply was ready; its work was cancelled."""


class BodyOverLimit(RequestError):
    """The body is larger than the limit; `declared`: its Content-Length, when that said so."""

    def __init__(self, declared: int | None = None) -> None:
        super().__init__(declared)
        self.declared = declared


class BodyTimedOut(RequestError):
    """The body was not complete in time; `received`: the bytes that had arrived."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


# Status codes that mean "try again later" rather than "your request is wrong".
RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})


class ProxyStartError(RequestError, RuntimeError):
    """The proxy server failed to start; the message holds the error it failed with."""


class ProxyRequestError(RequestError, RuntimeError):
    """A proxy endpoint answered with an error status (or could not be reached)."""

    def __init__(self, endpoint: str, status: int | None, detail: str) -> None:
        self.endpoint = endpoint
        self.status = status
        self.detail = detail
        where = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"proxy {endpoint} failed ({where}): {detail}")

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRYABLE_STATUS

"""`answers_health`: one probe of a starting server's `GET /health`, for the loops that wait for an
engine server or an environment server to come up."""

from __future__ import annotations

from collections.abc import Callable

import httpx


def answers_health(get: Callable[[str], httpx.Response], url: str) -> bool:
    """Whether `GET {url}/health` answers 200 now; False while the server does not answer yet
    (refused, reset, timed out) or answers anything else. `get`: the caller's client's `get`."""
    try:
        return get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False

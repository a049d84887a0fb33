"""The caller's key: where clients put it, and comparing it without leaking its length or prefix."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


def bearer_token_of(headers: Mapping[str, str]) -> str | None:
    """The key from `Authorization: Bearer <t>` or, as the Anthropic SDK sends it, `x-api-key`
    (any case-insensitive header mapping: Starlette's or httpx's)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    return None


def keys_equal(given: str, expected: str) -> bool:
    """`given == expected` in constant time (`hmac.compare_digest`), so timing tells nothing."""
    return hmac.compare_digest(given.encode(), expected.encode())

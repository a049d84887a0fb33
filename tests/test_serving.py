"""The serving plumbing both apps share: keys from either header, compared in constant time, and
the old import paths of the body and disconnect helpers."""

from __future__ import annotations

import httpx

from areal_nb.serving import bearer_token_of, keys_equal


def test_bearer_token_from_either_header():
    assert bearer_token_of(httpx.Headers({"Authorization": "Bearer  k-1 "})) == "k-1"
    assert bearer_token_of(httpx.Headers({"authorization": "bearer k-2"})) == "k-2"
    assert bearer_token_of(httpx.Headers({"x-api-key": " k-3 "})) == "k-3"  # the Anthropic SDK's header
    assert bearer_token_of(httpx.Headers({"Authorization": "Basic abc"})) is None
    assert bearer_token_of(httpx.Headers({"Authorization": "Bearer "})) is None
    assert bearer_token_of(httpx.Headers({})) is None


def test_keys_equal():
    assert keys_equal("secret-key", "secret-key")
    assert not keys_equal("secret-key", "secret-kez")
    assert not keys_equal("secret", "secret-key")
    assert keys_equal("ключ", "ключ")  # any text, not only ASCII


def test_old_import_paths():
    from areal_nb import serving
    from areal_nb.api.bounded_body import read_bounded_body
    from areal_nb.api.client_gone import ClientGone, unless_client_leaves

    assert read_bounded_body is serving.read_bounded_body
    assert (ClientGone, unless_client_leaves) == (serving.ClientGone, serving.unless_client_leaves)

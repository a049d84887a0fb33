"""Shared proxy fixtures: apps and real loopback servers around a ScriptedEngine or the real
tiny model (LocalEngine + tiny-math).

- `make_app(engine=None, **settings)` → a fresh app (ScriptedEngine "The answer is 4" by default).
- `app_client` → a `TestClient` on a fresh scripted app (in-process, no socket).
- `scripted_server` / `local_server` → running `ProxyServer`s on 127.0.0.1 (module scope).
- `new_session(client_or_url, task_id="t")` → `(session_id, api_key)` after granting capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from areal_nb.testing import ScriptedEngine

PROXY_ADMIN_KEY = "proxy-test-admin-key"
SCRIPTED_REPLY = "The answer is 4"


def admin_headers(key: str = PROXY_ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def session_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def start_session(
    client: httpx.Client | TestClient, task_id: str = "t", admin_key: str = PROXY_ADMIN_KEY
) -> tuple[str, str]:
    """Grant one slot and start a session; returns (session_id, session api_key)."""
    granted = client.post("/grant_capacity", headers=admin_headers(admin_key))
    assert granted.status_code == 200, granted.text
    started = client.post("/rl/start_session", headers=admin_headers(admin_key), json={"task_id": task_id})
    assert started.status_code == 200, started.text
    body = started.json()
    return body["session_id"], body["api_key"]


@pytest.fixture
def make_app(tiny_tokenizer) -> Callable[..., Any]:
    from areal_nb.proxy import ProxySettings, create_app

    def build(engine: Any = None, **settings: Any):
        settings.setdefault("admin_api_key", PROXY_ADMIN_KEY)
        engine = engine if engine is not None else ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY)
        return create_app(engine, tiny_tokenizer, ProxySettings(**settings))

    return build


@pytest.fixture
def app_client(make_app) -> Iterator[TestClient]:
    with TestClient(make_app(), raise_server_exceptions=True) as client:
        yield client


@pytest.fixture
def new_session() -> Callable[..., tuple[str, str]]:
    return start_session


@pytest.fixture(scope="module")
def scripted_server(tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    app = create_app(
        ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY),
        tiny_tokenizer,
        ProxySettings(admin_api_key=PROXY_ADMIN_KEY),
    )
    with ProxyServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def local_server(local_engine, tiny_tokenizer):
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    app = create_app(
        local_engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY, model_name="tiny-math")
    )
    with ProxyServer(app) as server:
        yield server

"""schemathesis over the app's own OpenAPI schema: no generated request may cause a 5xx.

Every case runs with valid credentials (admin key on admin routes, a fresh session's key on
session routes) so the fuzzing reaches the handlers, not just the auth check.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from areal_nb.models import load_tokenizer
from areal_nb.proxy import ProxySettings, create_app
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY

_tokenizer = load_tokenizer("tiny-math")
app = create_app(
    ScriptedEngine(_tokenizer, "The answer is 4"),
    _tokenizer,
    ProxySettings(admin_api_key=PROXY_ADMIN_KEY, export_wait_timeout=0.05),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
ADMIN_PATHS = ("/grant_capacity", "/rl/start_session", "/export_trajectories")


def _credentials(path: str) -> dict[str, str]:
    if path in ADMIN_PATHS:
        return {"Authorization": f"Bearer {PROXY_ADMIN_KEY}"}
    state = app.state.proxy
    state.grant_capacity()
    session = state.start_session("fuzz")
    # a session with one finished call, so rewards and exports have something to touch
    return {"Authorization": f"Bearer {session.api_key}"}


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    headers = {**(case.headers or {}), **_credentials(case.path)}
    response = case.call(headers=headers)
    assert response.status_code < 500, (
        f"{case.method} {case.path} → {response.status_code}: {response.text[:500]}"
    )
    if response.status_code >= 400:
        body = response.json()
        assert body["error"]["message"], body

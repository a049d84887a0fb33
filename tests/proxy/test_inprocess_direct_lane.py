"""The in-process transport's direct lane for chat and text completions answers exactly what the app's
ASGI stack answers: same status, headers and body, for served calls and for every refusal.

Each request runs twice, on two apps in the same state (a fresh session with the same history),
once through `InProcessTransport` and once through a plain `httpx.ASGITransport`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from areal_nb.proxy.inprocess import InProcessTransport, direct_routes
from areal_nb.testing import ScriptedEngine
from tests.proxy.conftest import PROXY_ADMIN_KEY, SCRIPTED_REPLY
from tests.proxy.hostile import CONTEXT, HOSTILE, Hostile, chat, encode

BASE = "http://proxy.invalid"
ADMIN = {"Authorization": f"Bearer {PROXY_ADMIN_KEY}"}
CHAT_CASES = [c for c in HOSTILE if c.path in ("/v1/chat/completions", "/v1/completions")]


class CountingASGI(httpx.ASGITransport):
    """The lane's fallback, counted: which requests the direct lane handed to the ASGI stack."""

    calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        type(self).calls += 1
        return await super().handle_async_request(request)


def lane_client(app: Any) -> httpx.AsyncClient:
    transport = InProcessTransport(app)
    transport._asgi = CountingASGI(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=BASE)


def asgi_client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url=BASE
    )


async def session_key(client: httpx.AsyncClient, end: bool = False, prefix: str = "") -> str:
    assert (await client.post(f"{prefix}/grant_capacity", headers=ADMIN)).status_code == 200
    started = await client.post(f"{prefix}/rl/start_session", headers=ADMIN, json={"task_id": "t"})
    key = started.json()["api_key"]
    if end:
        assert (
            await client.post(f"{prefix}/rl/end_session", headers={"Authorization": f"Bearer {key}"})
        ).status_code == 200
    return key


def normalized(response: httpx.Response) -> tuple[int, dict[str, str], Any]:
    """Status, headers and body, with the per-call id and timestamp blanked."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        body: Any = [
            json.loads(line[6:]) if line != "data: [DONE]" else line for line in text.split("\n\n") if line
        ]
        for chunk in body:
            if isinstance(chunk, dict):
                chunk.update(id="x", created=0)
    else:
        try:
            body = response.json()
        except ValueError:
            body = text
        if isinstance(body, dict) and "created" in body:
            body.update(id="x", created=0)
    headers = dict(response.headers)
    headers.pop("content-length", None)  # follows the body, whose id was blanked
    return response.status_code, headers, body


def scripted(tokenizer: Any, script: Any = SCRIPTED_REPLY) -> ScriptedEngine:
    """The scripted engine with tiny-math's context, so the context limits apply as on the real one."""
    engine = ScriptedEngine(tokenizer, script)
    engine.max_context = CONTEXT
    return engine


def both(make_app: Any, tokenizer: Any, send: Any, script: Any = SCRIPTED_REPLY) -> tuple[tuple, tuple, int]:
    """`send(client)` on a fresh app through the lane and on another through plain ASGI."""

    async def run(client: httpx.AsyncClient) -> httpx.Response:
        async with client:
            return await send(client)

    CountingASGI.calls = 0
    lane = asyncio.run(run(lane_client(make_app(scripted(tokenizer, script)))))
    fallbacks = CountingASGI.calls
    plain = asyncio.run(run(asgi_client(make_app(scripted(tokenizer, script)))))
    return normalized(lane), normalized(plain), fallbacks


def chat_request(
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    end: bool = False,
    key: str | None = None,
    path: str = "/v1/chat/completions",
):
    async def send(client: httpx.AsyncClient) -> httpx.Response:
        token = key if key is not None else await session_key(client, end=end)
        sent = {"Authorization": f"Bearer {token}", "content-type": "application/json", **(headers or {})}
        return await client.post(
            path, headers={k: v for k, v in sent.items() if v is not None}, content=encode(body)
        )

    return send


SERVED = {
    "plain call": chat(),
    "sampling, stop and metadata": chat(temperature=0.7, top_p=0.9, stop=["\n"], metadata={"k": "v"}),
    "streamed": chat(stream=True),
    "not stored": chat(store=False),
}


TEXT = "/v1/completions"
SERVED_TEXT = {
    "text completion, echo and log-probs": {
        "prompt": "2 + 2 =",
        "max_tokens": 8,
        "echo": True,
        "logprobs": 0,
    },
    "text completion streamed": {"prompt": "2 + 2 =", "stream": True, "logprobs": 0},
    "token ids, two samples": {"prompt": [[5, 6, 7], [8, 9]], "n": 2, "stop": ["\n"]},
}


@pytest.mark.parametrize("name", list(SERVED) + list(SERVED_TEXT))
def test_served_calls_take_the_lane_and_answer_like_the_app(make_app, tiny_tokenizer, name):
    send = chat_request(SERVED[name]) if name in SERVED else chat_request(SERVED_TEXT[name], path=TEXT)
    lane, plain, fallbacks = both(make_app, tiny_tokenizer, send)
    assert lane == plain and lane[0] == 200
    assert fallbacks == 1 + 1  # only grant_capacity and start_session went through ASGI


@pytest.mark.parametrize("case", CHAT_CASES, ids=[c.name for c in CHAT_CASES])
def test_every_hostile_chat_request_gets_the_apps_answer(make_app, tiny_tokenizer, case: Hostile):
    lane, plain, _ = both(make_app, tiny_tokenizer, chat_request(case.body, path=case.path))
    assert lane == plain and lane[0] == case.status


REFUSED = {
    "unknown key": (chat_request(chat(), key="no-such-key"), 401),
    "no key": (chat_request(chat(), key="", headers={"Authorization": None}), 401),
    "ended session": (chat_request(chat(), end=True), 409),
    "not JSON": (chat_request(b"{messages: oops"), 422),
    "a JSON list": (chat_request([1, 2]), 422),
    "no messages": (chat_request({"model": "m"}), 422),
    "text/plain": (chat_request(chat(), headers={"content-type": "text/plain"}), 422),
    "empty body": (chat_request(b""), 422),
    "text: top-k log-probs": (chat_request({"prompt": "a", "logprobs": 2}, path=TEXT), 400),
    "text: no prompt": (chat_request({"model": "m"}, path=TEXT), 422),
    "text: ended session": (chat_request({"prompt": "a"}, end=True, path=TEXT), 409),
    "text: unknown key": (chat_request({"prompt": "a"}, key="no-such-key", path=TEXT), 401),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refusals_and_odd_requests_answer_like_the_app(make_app, tiny_tokenizer, name):
    send, status = REFUSED[name]
    lane, plain, _ = both(make_app, tiny_tokenizer, send)
    assert lane == plain and lane[0] == status, lane


def test_an_engine_failure_is_the_apps_500(make_app, tiny_tokenizer):
    def broken(_request: Any) -> str:
        raise RuntimeError("engine on fire")

    lane, plain, fallbacks = both(make_app, tiny_tokenizer, chat_request(chat()), script=broken)
    assert lane == plain and lane[0] == 500 and "engine on fire" in lane[2]["error"]["message"]
    assert fallbacks == 2  # answered by the lane itself


def test_mounted_apps_get_their_lane_under_the_mount_path(make_app):
    """The Session's greedy twin at /eval: its sessions live in the twin's state."""
    root, twin = make_app(), make_app()
    root.mount("/eval", twin)
    assert set(direct_routes(root)) == {
        f"{mount}{prefix}/{path}"
        for mount in ("", "/eval")
        for prefix in ("/v1", "")
        for path in ("chat/completions", "completions")
    }

    async def main() -> httpx.Response:
        async with lane_client(root) as client:
            key = await session_key(client, prefix="/eval")
            return await client.post(
                "/eval/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat()
            )

    CountingASGI.calls = 0
    response = asyncio.run(main())
    assert response.status_code == 200 and CountingASGI.calls == 2
    assert [len(s.cache) for s in twin.state.proxy.sessions.values()] == [1] and not root.state.proxy.sessions

"""ProxyServer lifecycle (threads, ports, loops) and the standalone `areal-nb proxy` command."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest

from areal_nb.proxy import ProxyServer
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, start_session

pytestmark = pytest.mark.server  # real uvicorn servers on loopback

ROOT = Path(__file__).resolve().parents[2]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("areal-proxy-")]


def test_start_stop_releases_thread_and_port(make_app):
    before = len(_proxy_threads())
    server = ProxyServer(make_app())
    server.start()
    url, port = server.url, server.port
    assert server.start() is server and server.url == url  # starting twice is a no-op
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert not _port_is_free(port)
    server.stop()
    server.stop()  # idempotent
    assert _port_is_free(port) and len(_proxy_threads()) == before
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
    with pytest.raises(RuntimeError, match="not running"):
        server.url  # noqa: B018


def test_two_apps_in_one_process_are_independent(make_app):
    with ProxyServer(make_app()) as a, ProxyServer(make_app()) as b:
        assert a.port != b.port
        with httpx.Client(base_url=a.url) as ca, httpx.Client(base_url=b.url) as cb:
            _, key = start_session(ca)
            r = cb.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )
            assert r.status_code == 401  # a key of app A means nothing to app B
            assert cb.get("/health").json()["active_sessions"] == 0


def test_restart_after_stop_and_fixed_port(make_app):
    server = ProxyServer(make_app())
    port = server.start().port
    server.stop()
    again = ProxyServer(make_app(), port=port).start()
    try:
        assert again.port == port and httpx.get(f"{again.url}/health").status_code == 200
    finally:
        again.stop()
    assert server.start().port != 0
    server.stop()


def test_runs_on_a_loop_owned_by_the_caller(make_app):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        server = ProxyServer(make_app()).start(loop=loop)
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert not _proxy_threads() or all(t.name != f"areal-proxy-{server.port}" for t in _proxy_threads())
        port = server.port
        server.stop()
        assert _port_is_free(port)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_astart_inside_a_running_loop(make_app):
    async def run():
        async with ProxyServer(make_app()) as server:
            async with httpx.AsyncClient(base_url=server.url) as client:
                sid, key = await asyncio.to_thread(start_session, httpx.Client(base_url=server.url))
                r = await client.post(
                    "/v1/chat/completions",
                    headers={"x-api-key": key},
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                )
                assert r.status_code == 200
            port = server.port
        assert not server.running  # stopped on exit
        return port

    assert _port_is_free(asyncio.run(run()))


def test_default_admin_key_refused_off_loopback(tiny_tokenizer, monkeypatch):
    from areal_nb.proxy import ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine

    app = create_app(ScriptedEngine(tiny_tokenizer, "x"), tiny_tokenizer, ProxySettings())
    monkeypatch.delenv("AREAL_ALLOW_DEFAULT_ADMIN_KEY", raising=False)
    with pytest.raises(ValueError, match="default admin key"):
        ProxyServer(app, host="0.0.0.0")
    ProxyServer(app, host="127.0.0.1")  # loopback is fine
    ProxyServer(app, host="::1")
    monkeypatch.setenv("AREAL_ALLOW_DEFAULT_ADMIN_KEY", "1")
    ProxyServer(app, host="0.0.0.0")  # explicit override


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "areal_nb.cli",
            "proxy",
            "--model",
            "tiny-math",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-key",
            PROXY_ADMIN_KEY,
            "--device",
            "cpu",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_the_sdk_and_stops_on_signal(sig):
    port = _free_port()
    proc = _launch(port, "--chat-template-type", "concat")
    try:
        line = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}" in line, line + proc.stderr.read()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-math"
            sid, key = start_session(client, "cli")
            sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
            completion = sdk.chat.completions.create(
                model="tiny-math", messages=[{"role": "user", "content": "1+1?"}], max_tokens=8
            )
            assert completion.usage.completion_tokens > 0
            client.post("/rl/end_session", headers={"x-api-key": key})
            wire = client.post(
                "/export_trajectories", headers=admin_headers(), json={"session_id": sid}
            ).json()["interactions"]
            assert wire[completion.id]["chat_template_type"] == "concat"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        assert "stopping" in proc.stdout.read()
        assert _port_is_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_default_key_off_loopback():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AREAL_ALLOW_DEFAULT_ADMIN_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "areal_nb.cli", "proxy", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 2 and "default admin key" in out.stderr

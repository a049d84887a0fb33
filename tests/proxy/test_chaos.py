"""Chaos: while 32 honest sessions run 4 turns each against `areal-nb proxy` with the
real tiny model, a hostile client sends every request of the catalogue in a loop (and abandons
waiting exports). Every honest session finishes and exports exactly once, `/health` answers within
100 ms at p99 throughout (measured by a separate process, so the test's own clients do not skew
it), every hostile request gets its expected 4xx, and the server log stays bounded.

This is the one test that asserts a time: the p99 bound is the issue's acceptance criterion.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers
from tests.proxy.hostile import HOSTILE, check_answer, new_session_key, send

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SESSIONS, TURNS = 32, 4
HEALTH_P99_S = 0.100
MIN_WINDOW_S = 30.0

# A separate process polls /health every 10 ms until the stop file appears, then prints the
# latencies (seconds) as JSON.
PROBE = r"""
import json, os, sys, time, httpx
url, stop = sys.argv[1], sys.argv[2]
lat = []
with httpx.Client(base_url=url, timeout=10) as c:
    while not os.path.exists(stop):
        t = time.perf_counter()
        assert c.get("/health").status_code == 200
        lat.append(time.perf_counter() - t)
        time.sleep(0.01)
print(json.dumps(lat))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _honest_turn_content(session: int, turn: int) -> str:
    return f"{session + turn}+{turn + 3}="


async def _honest_session(client: httpx.AsyncClient, index: int) -> tuple[str, list[str], dict]:
    admin = admin_headers()
    assert (await client.post("/grant_capacity", headers=admin)).status_code == 200
    started = await client.post("/rl/start_session", headers=admin, json={"task_id": f"honest-{index}"})
    assert started.status_code == 200, started.text
    sid, key = started.json()["session_id"], started.json()["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    messages: list[dict] = []
    ids = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": _honest_turn_content(index, turn)})
        r = await client.post(
            "/v1/chat/completions",
            headers=headers,
            json={"messages": messages, "max_tokens": 12, "temperature": 1.0},
        )
        assert r.status_code == 200, r.text
        ids.append(r.json()["id"])
        messages.append(r.json()["choices"][0]["message"])
    assert (await client.post("/rl/set_reward", headers=headers, json={"reward": 1.0})).status_code == 200
    assert (await client.post("/rl/end_session", headers=headers)).status_code == 200
    exported = await client.post("/export_trajectories", headers=admin, json={"session_id": sid})
    assert exported.status_code == 200, exported.text
    again = await client.post("/export_trajectories", headers=admin, json={"session_id": sid})
    assert again.status_code == 404  # exactly once
    return sid, ids, exported.json()["interactions"]


async def _honest_all(url: str) -> list:
    limits = httpx.Limits(max_connections=SESSIONS + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(_honest_session(client, i) for i in range(SESSIONS)))


def _hostile_loop(url: str, stop: threading.Event, sent: list[str], wrong: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            for case in HOSTILE:
                if stop.is_set():
                    return
                _, key = new_session_key(client, "hostile")
                try:
                    check_answer(case, send(client, case, key))
                except AssertionError as exc:
                    wrong.append(str(exc)[:300])
                sent.append(case.name)
            # an export abandoned while it waits: the session must stay exportable
            sid, key = new_session_key(client, "abandon")
            try:
                client.post(
                    "/export_trajectories",
                    headers=admin_headers(),
                    json={"session_id": sid, "wait_timeout": 30},
                    timeout=0.3,
                )
                wrong.append("a waiting export returned before end_session")
            except httpx.ReadTimeout:
                pass
            client.post(
                "/v1/chat/completions",
                headers={"x-api-key": key},
                json={"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2},
            )
            client.post("/rl/set_reward", headers={"x-api-key": key}, json={"reward": 0.0})
            client.post("/rl/end_session", headers={"x-api-key": key})
            r = client.post("/export_trajectories", headers=admin_headers(), json={"session_id": sid})
            if r.status_code != 200 or len(r.json()["interactions"]) != 1:
                wrong.append(f"abandoned export lost the session: {r.status_code} {r.text[:200]}")
            sent.append("abandoned export")


def test_honest_sessions_survive_a_hostile_client(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "areal_nb.cli", "proxy", "--model", "tiny-math", "--host", "127.0.0.1",
             "--port", str(port), "--admin-key", PROXY_ADMIN_KEY, "--device", "cpu"],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
    probe = None
    try:
        line = server.stdout.readline()
        assert f"listening on {url}" in line, line + log_path.read_text()
        stop_file = tmp_path / "stop"
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, url, str(stop_file)], stdout=subprocess.PIPE, text=True, env=env
        )

        # warm up (first template render, first generation) before measuring anything
        with httpx.Client(base_url=url, timeout=120) as warm:
            _, key = new_session_key(warm, "warm")
            warm.post(
                "/v1/chat/completions",
                headers={"x-api-key": key},
                json={"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2},
            )

        stop, sent, wrong = threading.Event(), [], []
        hostile = threading.Thread(target=_hostile_loop, args=(url, stop, sent, wrong), daemon=True)
        started = time.monotonic()
        hostile.start()
        results = asyncio.run(_honest_all(url))
        # a generous window: at least two rounds of every class and MIN_WINDOW_S of probing
        rounds = 2 * (len(HOSTILE) + 1)
        while (len(sent) < rounds or time.monotonic() - started < MIN_WINDOW_S) and hostile.is_alive():
            hostile.join(0.5)
        stop.set()
        hostile.join(300)
        stop_file.touch()
        latencies = sorted(json.loads(probe.communicate(timeout=60)[0]))
        assert server.poll() is None  # still serving
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
        server.terminate()
        server.wait(timeout=60)

    # every honest session: 4 turns, exported exactly once, a linear chain with its reward
    exported = [iid for _, ids, wire in results for iid in wire]
    assert len(exported) == len(set(exported)) == SESSIONS * TURNS
    for _, ids, wire in results:
        assert list(wire) == ids
        assert [wire[i]["parent_id"] for i in ids] == [None, *ids[:-1]]
    assert not wrong, wrong[:5]
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    figures = (
        f"/health: {len(latencies)} probes, p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms; hostile requests sent: {len(sent)}"
    )
    print(figures)
    assert len(latencies) >= 500, figures
    assert p99 <= HEALTH_P99_S, figures
    log_lines = log_path.read_text().splitlines()
    assert len(log_lines) <= 50, "\n".join(log_lines[:50])  # bounded: no per-request error spam

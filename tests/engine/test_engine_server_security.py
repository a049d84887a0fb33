"""`areal-nb engine-server` guards: the API key, the weights directory, and staying up after bad input.

One real server subprocess on loopback with `--api-key` and `--weights-dir`."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from servers import API_KEY, load_reference, start_engine_server

from areal_nb.cli.engine_server import main as engine_server_main
from areal_nb.engine.factory import API_KEY_ENV
from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port
from areal_nb.engine.weight_sync import write_weights

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 42, 99, 7, 31]
GREEDY = {
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("secure")
    proc = start_engine_server(root)
    yield proc, root
    proc.stop()


def _client(proc, key: str | None = API_KEY) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=proc.url, headers=headers, timeout=120)


def _still_serving(proc) -> None:
    with _client(proc) as client:
        reply = client.post("/generate", json=GREEDY)
    assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 3


@pytest.mark.parametrize("key", [None, "wrong-key"], ids=["no-key", "wrong-key"])
def test_every_route_but_health_needs_the_key(served, key):
    proc, _ = served
    with _client(proc, key) as client:
        for method, path, body in [
            ("POST", "/generate", GREEDY),
            ("GET", "/model_info", None),
            ("POST", "/pause_generation", {}),
            ("POST", "/abort_request", {"abort_all": True}),
            ("POST", "/update_weights_from_disk", {"model_path": "/etc"}),
        ]:
            reply = client.request(method, path, json=body)
            assert (reply.status_code, reply.json()) == (401, {"error": "Unauthorized"}), path
        assert client.get("/health").status_code == 200
    _still_serving(proc)


def test_weights_load_only_from_under_the_weights_dir(served, tmp_path):
    proc, root = served
    weights_dir = root / "weights"
    model = load_reference(load_model_path())
    outside = write_weights(tmp_path / "elsewhere", 7, model)  # valid weights, wrong place
    (weights_dir / "escape").symlink_to(outside, target_is_directory=True)
    linked_files = weights_dir / "linked-files"
    linked_files.mkdir()
    for f in outside.iterdir():
        os.symlink(f, linked_files / f.name)
    attempts = [
        str(outside),
        str(weights_dir / ".." / ".." / outside.relative_to(outside.anchor)),
        "escape",
        str(weights_dir / "escape"),
        str(linked_files),
        "/etc",
    ]
    with _client(proc) as client:
        for path in attempts:
            reply = client.post("/update_weights_from_disk", json={"model_path": path, "weight_version": "7"})
            assert reply.status_code == 400 and reply.json()["success"] is False, path
            assert "outside the allowed weights directory" in reply.json()["message"], path
        assert client.get("/model_info").json()["weight_version"] == "0"
        inside = write_weights(weights_dir, 1, model)
        reply = client.post(
            "/update_weights_from_disk", json={"model_path": inside.name, "weight_version": "1"}
        )
        assert reply.status_code == 200 and reply.json()["success"] is True
        assert client.get("/model_info").json()["weight_version"] == "1"
    _still_serving(proc)


def test_malformed_bodies_are_400_and_the_server_keeps_serving(served):
    proc, _ = served
    with _client(proc) as client:
        assert (
            client.post(
                "/generate", content=b"{not json", headers={"content-type": "application/json"}
            ).status_code
            == 400
        )
        assert client.post("/generate", json=[1, 2]).status_code == 400
        assert client.post("/generate", json={"input_ids": PROMPT, "stream": True}).status_code == 400
        assert client.post("/pause_generation", json={"mode": "sideways"}).status_code == 400
        assert client.post("/update_weights_from_disk", json={}).status_code == 400
        reply = client.post(
            "/update_weights_from_disk", json={"model_path": "version-1", "weight_version": "v2"}
        )
        assert reply.status_code == 400 and "integer" in reply.json()["message"]
        reply = client.post(
            "/generate", json={"input_ids": PROMPT, "rid": ["a", "a"]} | {"input_ids": [PROMPT, PROMPT]}
        )
        assert reply.status_code == 400 and "Duplicate" in reply.json()["error"]["message"]
    _still_serving(proc)


def test_the_key_is_required_off_loopback(capsys, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert engine_server_main(["--host", "0.0.0.0", "--port", "0"]) == 2
    assert "an API key is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, error",
    [
        (["--api-key", "k" * 16, "--api-key-file", "/nonexistent"], "not both"),
        (["--api-key-file", "/nonexistent/key"], "cannot read --api-key-file"),
    ],
)
def test_bad_key_options_are_refused(args, error, capsys):
    assert engine_server_main(["--port", "0", *args]) == 2
    assert error in capsys.readouterr().err


def test_an_empty_key_file_is_refused(tmp_path, capsys):
    (tmp_path / "key").write_text("\n")
    assert engine_server_main(["--port", "0", "--api-key-file", str(tmp_path / "key")]) == 2
    assert "is empty" in capsys.readouterr().err


@pytest.mark.server
@pytest.mark.parametrize("source", ["env", "file"])
def test_the_key_from_the_environment_or_a_file_stays_off_the_command_line(source, tmp_path):
    key = "key-from-" + source + "-0123456789"
    port = free_port()
    command = engine_server_command("tiny-math", port=port)  # no --api-key
    env = {API_KEY_ENV: key} if source == "env" else {API_KEY_ENV: ""}
    if source == "file":
        (tmp_path / "key").write_text(key + "\n")
        command += ["--api-key-file", str(tmp_path / "key")]
    proc = ServerProcess(command, f"http://127.0.0.1:{port}", log_path=tmp_path / "server.log", env=env)
    proc.start()
    try:
        proc.wait_ready(timeout=300)
        assert key not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        for sent, status in [(None, 401), ("wrong-key", 401), (key, 200)]:
            headers = {"Authorization": f"Bearer {sent}"} if sent else {}
            reply = httpx.post(f"{proc.url}/generate", json=GREEDY, headers=headers, timeout=120)
            assert reply.status_code == status, (sent, reply.text)
    finally:
        proc.stop()


def test_torch_threads_must_be_positive(capsys):
    assert engine_server_main(["--port", "0", "--torch-threads", "0"]) == 2
    assert "--torch-threads must be >= 1" in capsys.readouterr().err


def load_model_path() -> str:
    from areal_nb.models import resolve_model_path

    return str(resolve_model_path("tiny-math"))

"""What a launched server inherits and how the client names and updates things on it.

- A server started from a torchrun rank gets none of torchrun's variables (torchrun itself is run
  here to learn which ones it sets), but keeps the rest of the environment and the caller's `env`.
- Server-side request ids are never a prefix of one another (SGLang aborts by prefix).
- `engine.max_batch_size` and `model.dtype` reach the servers' command lines; a hand-started
  engine-server and a Session's servers get their own threading defaults; engine-server's
  `--dtype` takes SGLang's names.
- A weights folder a server refuses is asked for again with backoff: one that appears late loads,
  one that never appears fails after `weights_wait` naming the path, and changes nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from areal_nb.cli.engine_server import build_parser
from areal_nb.config import EngineConfig
from areal_nb.engine.defaults import DEFAULT_SINGLE_THREAD_ROWS
from areal_nb.engine.launcher import TORCHRUN_PREFIXES, TORCHRUN_VARIABLES, server_environment
from areal_nb.engine.remote import server_rid
from areal_nb.engine.remote_launch import ServerCommands

# Run under torchrun: write this rank's environment, then start a "server" (a Python process that
# writes its own environment) through ServerProcess, as the Session's launcher would.
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from areal_nb.engine.launcher import ServerProcess
    out = sys.argv[1]
    json.dump(dict(os.environ), open(out + "/rank.json", "w"))
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    proc = ServerProcess([sys.executable, "-c", dump, out + "/server.json"], "http://127.0.0.1:1",
                         env={"AREAL_NB_MARK": "kept"}).start()
    deadline = time.monotonic() + 60
    while proc.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.stop()
    """
)


@pytest.mark.server  # torchrun in a subprocess
def test_a_server_started_under_torchrun_gets_none_of_torchruns_variables(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    }
    env = {
        k: v for k, v in env.items() if k not in TORCHRUN_VARIABLES and not k.startswith(TORCHRUN_PREFIXES)
    }
    subprocess.run(
        [torchrun, "--nproc-per-node", "1", "--master-port", "0", str(script), str(tmp_path)],
        env=env,
        check=True,
        timeout=180,
        capture_output=True,
    )
    rank = json.loads((tmp_path / "rank.json").read_text())
    server = json.loads((tmp_path / "server.json").read_text())
    added_by_torchrun = {k for k in rank if k not in env or rank[k] != env[k]}
    assert {"TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "RANK", "WORLD_SIZE"} <= added_by_torchrun
    leaked = sorted(k for k in added_by_torchrun if k in server)
    assert leaked == [], f"torchrun's {leaked} reached the server"
    # everything else is passed on, and the caller's own env wins
    assert server["PYTHONPATH"] == env["PYTHONPATH"] and server["AREAL_NB_MARK"] == "kept"


def test_server_environment_keeps_what_the_caller_gives():
    env = server_environment(
        {"RANK": "3", "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin", "OMP_NUM_THREADS": "4"}, {"RANK": "0"}
    )
    assert env == {
        "PATH": "/bin",
        "OMP_NUM_THREADS": "4",
        "RANK": "0",
    }  # an explicit env entry is the caller's choice


def test_no_server_rid_is_a_prefix_of_another():
    ids = [server_rid("a" * 32, n) for n in range(100_000)]
    ids += [server_rid("b" * 32, n) for n in (0, 1, 10, 2**40)]  # another engine's, and a far count
    ordered = sorted(set(ids))
    assert len(ordered) == len(ids)
    # in sorted order a prefix comes right before some string it starts: checking neighbours suffices
    clashes = [(a, b) for a, b in itertools.pairwise(ordered) if b.startswith(a)]
    assert clashes == []
    # the shape that was used before fails the same check (the test can fail)
    old = sorted(f"p-{n}" for n in range(100))
    assert any(b.startswith(a) for a, b in itertools.pairwise(old))


def test_max_batch_size_and_threading_reach_the_servers_command_lines():
    sglang = ServerCommands("sglang", "/m", max_batch_size=48, single_thread_rows=64).line(30000)
    assert sglang[sglang.index("--max-running-requests") + 1] == "48"
    mine = ServerCommands(
        "sglang",
        "/m",
        extra_args=["--max-running-requests", "7"],
        max_batch_size=48,
        single_thread_rows=64,
    ).line(30000)
    assert mine.count("--max-running-requests") == 1 and mine[mine.index("--max-running-requests") + 1] == "7"
    cpu = ServerCommands("engine-server", "/m", max_batch_size=48, single_thread_rows=64).line(30000)
    assert cpu[cpu.index("--max-batch-size") + 1] == "48"
    # servers beside the Session's trainer: the Session's threading; a server alone: every core
    assert cpu[cpu.index("--single-thread-rows") + 1] == str(DEFAULT_SINGLE_THREAD_ROWS)
    assert build_parser().parse_args([]).single_thread_rows == 0
    assert EngineConfig().single_thread_rows == DEFAULT_SINGLE_THREAD_ROWS > 0


def test_the_serving_dtype_reaches_the_servers_command_lines_unless_the_user_gives_one():
    for server, flag in (("sglang", "--dtype"), ("engine-server", "--dtype")):
        cmd = ServerCommands(server, "/m", dtype="bfloat16").line(30000)
        assert cmd[cmd.index(flag) + 1] == "bfloat16"
        mine = ServerCommands(server, "/m", extra_args=[flag, "float16"], dtype="bfloat16").line(30000)
        assert mine.count(flag) == 1 and mine[mine.index(flag) + 1] == "float16"
    remote = ServerCommands(["serve", "{model}"], "/m", dtype="bfloat16").line(30000)
    assert "--dtype" not in remote  # a command of the user's own gets only what it names


def test_engine_server_passes_each_named_flag_to_a_keyword_of_that_name():
    import dataclasses
    import inspect

    from areal_nb.cli.engine_server import ENGINE_FLAGS, SETTINGS_FLAGS, flags_named
    from areal_nb.engine.local import LocalEngine
    from areal_nb.engine.server import EngineServerSettings

    args = build_parser().parse_args(["--seed", "7", "--body-timeout", "3.5"])
    assert set(ENGINE_FLAGS) <= set(inspect.signature(LocalEngine).parameters)
    assert set(SETTINGS_FLAGS) <= {f.name for f in dataclasses.fields(EngineServerSettings)}
    assert flags_named(args, ENGINE_FLAGS)["seed"] == 7
    assert flags_named(args, SETTINGS_FLAGS)["body_timeout"] == 3.5


def test_engine_server_dtype_names_are_sglangs_and_auto_keeps_the_saved_dtype(tmp_path, tiny_model_path):
    import torch

    from areal_nb.cli.engine_server import serving_dtype

    assert serving_dtype("auto", tiny_model_path) == torch.float32  # tiny-math is saved in float32
    assert [
        serving_dtype(n, tiny_model_path) for n in ("half", "float16", "bfloat16", "float", "float32")
    ] == [
        torch.float16,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float32,
    ]
    saved = json.loads((Path(tiny_model_path) / "config.json").read_text())
    saved.pop("dtype", None)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "torch_dtype": "bfloat16"}))  # the older key
    assert serving_dtype("auto", str(tmp_path)) == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({**saved, "dtype": "complex-ish"}))
    with pytest.raises(ValueError, match="complex-ish"):
        serving_dtype("auto", str(tmp_path))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dtype", "fp8"])


@pytest.fixture
def engine_server(tmp_path, tiny_model_path):
    """An engine-server app on a real uvicorn thread with a LocalEngine on tiny-math."""
    from areal_nb.engine import LocalEngine
    from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
    from areal_nb.proxy.server import ProxyServer

    weights = tmp_path / "weights"
    weights.mkdir()
    engine = LocalEngine(tiny_model_path, seed=0)
    server = ProxyServer(create_engine_app(engine, EngineServerSettings(weights_dir=str(weights))), port=0)
    server.start()
    yield server, weights, engine
    server.stop()
    engine.close()


@pytest.mark.server
def test_a_weights_folder_that_appears_late_is_loaded(engine_server, reference_model):
    from areal_nb.engine.remote import SGLangEngine
    from areal_nb.engine.weight_sync import write_weights

    server, weights, engine = engine_server
    client = SGLangEngine([server.url], weights_wait=60.0)
    target = weights / "version-1"
    writer = threading.Timer(1.5, lambda: write_weights(weights, 1, reference_model))
    try:
        writer.start()
        started = time.monotonic()
        client.update_weights(str(target), version=1)
        assert time.monotonic() - started >= 1.0  # it waited for the folder (a lower bound only)
        assert engine.get_version() == 1 and client.get_version() == 1
    finally:
        writer.cancel()
        client.close()


@pytest.mark.server
def test_a_weights_folder_that_never_appears_fails_with_its_path(engine_server):
    from areal_nb.engine.remote import EngineServerError, SGLangEngine

    server, weights, engine = engine_server
    client = SGLangEngine([server.url], weights_wait=1.0)
    missing = weights / "version-9"
    try:
        with pytest.raises(EngineServerError, match="refused the weights at .*version-9") as info:
            client.update_weights(str(missing), version=9)
        assert str(missing) in str(info.value) and "time(s)" in str(info.value)
        assert engine.get_version() == 0 and client.get_version() == 0
    finally:
        client.close()

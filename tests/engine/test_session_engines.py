"""The Session on server engines: `engine.type: sglang` (the launch path, with the command
swapped for `areal-nb engine-server`) and `engine.type: remote` (two engine servers this test
starts), with the real proxy, agent and tiny model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from servers import API_KEY, start_engine_server

from areal_nb import Session
from areal_nb.config import load_config
from areal_nb.session import builder
from areal_nb.train.logprobs import compute_token_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.server]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi_turn_math.yaml"
SMALL = dict(
    rollout__batch_size=2,
    rollout__group_size=2,
    logging__progress=False,
    rollout__prefetch=False,
    total_steps=3,
)


def config(tmp_path: Path, **kw):
    overrides = {**SMALL, "logging.run_dir": str(tmp_path / "run"), **kw}
    return load_config(CONFIG, {k.replace("__", "."): v for k, v in overrides.items()})


def process_group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)  # signal 0: does any process of the server's group still exist?
    except ProcessLookupError:
        return True
    return False


@contextlib.contextmanager
def engine_servers(tmp_path: Path, extra_args: list[str] = ()):
    """Two `areal-nb engine-server`s someone else started (a, b), sharing one weights folder."""
    shared = tmp_path / "shared-weights"
    procs = [
        start_engine_server(tmp_path / n, name=n, weights_dir=shared, extra_args=extra_args)
        for n in ("a", "b")
    ]
    try:
        yield procs, shared
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture
def two_servers(tmp_path):
    with engine_servers(tmp_path) as servers:
        yield servers


def remote_config(tmp_path: Path, procs, shared: Path, **kw):
    """`engine.type: remote` over `procs`, with the shared weights folder."""
    return config(
        tmp_path,
        **{
            "engine.type": "remote",
            "engine.addresses": [p.url for p in procs],
            "engine.api_key": API_KEY,
            "engine.weights_dir": str(shared),
            **kw,
        },
    )


def launch_config(tmp_path: Path, n_servers: int = 2):
    return config(
        tmp_path,
        **{
            "engine.type": "sglang",
            "engine.launch.command": "engine-server",
            "engine.launch.n_servers": n_servers,
            "engine.api_key": "launch-key",
        },
    )


def test_sglang_launch_path_streams_logs_trains_and_close_stops_the_servers(tmp_path):
    session = Session(launch_config(tmp_path))
    try:
        procs = session.engine.owned_processes
        pids = [p.pid for p in procs]
        assert len(pids) == 2 and session.engine.health() == [True, True]  # ready before start() returned
        batch = session.rollout()
        assert len(batch.episodes) == 4 and not batch.rejected
        row = session.train_step(batch)
        assert row["version"] == 1 and session.engine.get_version() == 1
        assert (tmp_path / "run" / "weights").is_dir()  # default weights_dir: <run_dir>/weights
        log = session.engine_log()
        for i in range(2):
            text = (tmp_path / "run" / "engine_logs" / f"server-{i}.log").read_text()
            assert "engine-server listening on" in text
            assert any(line.startswith(f"[server {i}] ") and "listening on" in line for line in log.lines)
        assert log.widget().value.splitlines()[-1] == log.lines[-1]

        # Ctrl-C in the cell: the rollout's requests are cancelled, the servers keep serving.
        # The interrupt comes once requests are in flight (not after a fixed delay: a fast
        # machine could finish the rollout first and the signal would hit the test itself).
        # Ctrl-C raises KeyboardInterrupt as in a kernel, whatever handler an earlier test left
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def interrupt_once_generating() -> None:
            for _ in range(3000):
                if any(s["in_flight"] for s in session.engine.server_status()):
                    break
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        interrupter = threading.Thread(target=interrupt_once_generating)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            session.rollout(64)  # far more than one round of requests
        interrupter.join()
        for _ in range(300):  # the cancellations reach the engine's own loop thread; a hang guard
            if [s["in_flight"] for s in session.engine.server_status()] == [0, 0]:
                break
            time.sleep(0.1)
        assert [s["in_flight"] for s in session.engine.server_status()] == [0, 0]
        assert all(p.alive for p in procs) and session.engine.health() == [True, True]
        assert len(session.rollout(1).episodes) == 2
    finally:
        session.close()
    assert all(process_group_gone(pid) for pid in pids)
    assert all(not p.alive for p in procs)


def test_interrupt_during_start_stops_the_launched_servers(tmp_path, monkeypatch):
    launched = []
    real_build_engine = builder.build_engine

    def build_engine(*args, **kwargs):
        launched.append(real_build_engine(*args, **kwargs))
        return launched[-1]

    def build_actor(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C in the cell right after the servers came up

    monkeypatch.setattr(builder, "build_engine", build_engine)
    monkeypatch.setattr(builder, "build_actor", build_actor)
    with pytest.raises(KeyboardInterrupt):
        Session(launch_config(tmp_path, n_servers=1))
    (engine,) = launched
    assert engine.closed and all(process_group_gone(p.pid) for p in engine.owned_processes)


def recomputed_logprobs_match(session, batch) -> float:
    """Largest |recorded - recomputed| over the trained tokens, the trainer's model teacher-forced."""
    t = batch.to_tensors().tensors()
    with torch.no_grad():
        ours = compute_token_logprobs(
            session.actor.model,
            t["input_ids"],
            t["attention_mask"],
            temperature=session.actor.temperature,
        )
    mask = t["loss_mask"].bool()
    assert mask.any()
    return float((ours - t["logprobs"]).abs()[mask].max())


def test_demo_config_trains_through_remote_servers_with_exact_logprobs(tmp_path, two_servers):
    procs, shared = two_servers
    cfg = remote_config(tmp_path, procs, shared)
    with Session(cfg) as session:
        assert session.version == 0 and session.engine.get_version() == 0
        history = session.run(3)
        assert list(history["version"]) == [1, 2, 3]
        # every step's batch was sampled by the servers with the weights the trainer had then
        assert (history["logprob_abs_diff_max"] < 1e-4).all()
        batch = session.rollout()  # after three updates
        assert batch.version == 3 and not batch.rejected
        assert recomputed_logprobs_match(session, batch) < 1e-4
        assert all(s["down"] is None and s["assigned"] > 0 for s in session.engine.server_status())
        result = session.evaluate(n=8)
        assert result.n == 8 and result.rejected == 0 and 0.0 <= result.accuracy <= 1.0


class KillAfterFirstTurnAgent:
    """Two turns; after every episode's first reply, the last one to get there kills server
    `victim` (SIGKILL to its process group), and all go on to their second turn."""

    def __init__(self, victim_pgid: int, episodes: int) -> None:
        self.victim_pgid, self.episodes = victim_pgid, episodes
        self.first_turns = 0
        self.killed = threading.Event()

    async def run(self, data, *, base_url, api_key, http_client):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        checking = "/eval" in str(base_url)  # the Session's first-episode check, before the rollout
        # a distinct opening per episode: two samples of one group may reply alike, and identical
        # conversations may legitimately continue on either server
        self.opened = getattr(self, "opened", 0) + 1
        messages = [{"role": "system", "content": f"Episode {self.opened}."}, *data["messages"]]
        first = await client.chat.completions.create(model="any", messages=messages, max_completion_tokens=4)
        if checking:
            return 1.0
        self.first_turns += 1
        if self.first_turns == self.episodes:
            os.killpg(self.victim_pgid, signal.SIGKILL)  # a crash, not a clean shutdown
            self.killed.set()
        for _ in range(600):  # a hang guard; the others wait for the kill
            if self.killed.is_set():
                break
            await asyncio.sleep(0.05)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "Again."},
        ]
        await client.chat.completions.create(model="any", messages=messages, max_completion_tokens=4)
        return 1.0


def test_killing_one_server_mid_rollout_rejects_its_episodes_and_the_rest_finish(tmp_path, two_servers):
    procs, shared = two_servers
    dead = procs[0]
    agent = KillAfterFirstTurnAgent(dead.pid, episodes=8)
    cfg = remote_config(
        tmp_path,
        procs,
        shared,
        **{
            "rollout.batch_size": 4,
            "rollout.group_size": 2,
            "agent.workflow": agent,
            "agent.workflow_kwargs": {},
            "agent.agent_timeout": 120,
        },
    )
    with Session(cfg) as session:
        # the first turns spread over both servers; each second turn goes where its first was
        batch = session._lead.runtime.call(session.arollout(), timeout=300)  # a hang guard, not a timing
        assert agent.killed.is_set()
        reasons = [ep.rejection_reason for ep in batch.rejected]
        assert 0 < len(reasons) < 8 and len(batch.episodes) == 8
        assert all(dead.url in str(r) for r in reasons), reasons
        status = session.engine.server_status()
        assert status[0]["down"] is not None and status[1]["down"] is None
        # training and the next rollout go on with the survivor alone
        session.train_step(batch)
        again = session._lead.runtime.call(session.arollout(), timeout=300)
        assert not again.rejected and again.version == 1


KERNEL = """
import sys
from areal_nb import Session
from areal_nb.config import load_config
cfg = load_config(sys.argv[1], {"logging.run_dir": sys.argv[2], "logging.progress": False,
                                "engine.type": "sglang", "engine.launch.command": "engine-server"})
session = Session(cfg)
print("PIDS", *[p.pid for p in session.engine.owned_processes], flush=True)
# the kernel exits without session.close(): the atexit hooks must stop the servers
"""


def test_kernel_exit_without_close_stops_the_servers(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", KERNEL, str(CONFIG), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("PIDS")]
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 1 and all(process_group_gone(pid) for pid in pids)


LORA = {"r": 4, "alpha": 8.0, "target_modules": "all-linear"}


def check_lora_session(session, weights: Path, synced_base: bool = False) -> None:
    """Two steps; every batch the servers sampled is the trainer's base + adapter of its version."""
    assert session.engine.serves_lora_adapters
    before = session.rollout()
    session.run(2)
    # a step whose groups all had equal rewards has no gradient: step on (a few more at most)
    # until the adapter has moved the policy, so the checks below can tell base from adapter
    while recomputed_logprobs_match(session, before) <= 1e-3 and session.version < 10:
        session.run(1)
    history, last = session.history, session.version
    assert list(history["version"]) == list(range(1, last + 1))
    # each step from the second on trained on what the servers sampled with the previous adapter
    assert (history["logprob_abs_diff_max"] < 1e-4).all()
    batch = session.rollout()  # with the last version's adapter
    assert batch.version == last and not batch.rejected
    assert recomputed_logprobs_match(session, batch) < 1e-4
    # the adapter changed the policy: the base's record no longer matches the trainer
    assert recomputed_logprobs_match(session, before) > 1e-3
    pushed = sorted(p.name for p in weights.iterdir() if not p.name.startswith("."))
    # adapters only, never a model (remote servers get the trainer's base once, at start)
    expected = [f"adapter-{last - 1}", f"adapter-{last}"] + (["version-0"] if synced_base else [])
    assert pushed == sorted(expected)
    model_bytes = sum(f.stat().st_size for f in Path(session.engine.config_source).glob("*.safetensors"))
    adapter_bytes = (weights / f"adapter-{last}" / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < model_bytes / 4, (adapter_bytes, model_bytes)


def test_a_lora_session_pushes_adapters_to_launched_engine_servers_with_exact_logprobs(tmp_path):
    """`actor.lora` on the launch path: the server starts with the LoRA flags, each version's
    adapter (not the model) goes to it, and what it samples is the trainer's base + adapter."""
    cfg = config(
        tmp_path,
        **{
            "engine.type": "sglang",
            "engine.launch.command": "engine-server",
            "engine.launch.n_servers": 1,
            "actor.lora": LORA,
            "actor.lr": 5e-3,  # large enough that the adapter moves the log-probs visibly
            "total_steps": 10,
        },
    )
    with Session(cfg) as session:
        (proc,) = session.engine.owned_processes
        flags = proc.command[proc.command.index("--enable-lora") :]
        assert flags[:5] == ["--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", "all"]
        check_lora_session(session, tmp_path / "run" / "weights")


def test_a_lora_session_pushes_adapters_to_remote_engine_servers_with_exact_logprobs(tmp_path):
    """The same on two servers someone else started with the LoRA flags (`engine.type: remote`)."""
    from areal_nb.engine.launcher import lora_server_args

    with engine_servers(tmp_path, lora_server_args(4, "all-linear")) as (procs, shared):
        cfg = remote_config(
            tmp_path,
            procs,
            shared,
            **{
                "actor.lora": LORA,
                "actor.lr": 5e-3,
                "total_steps": 10,
            },
        )
        with Session(cfg) as session:
            check_lora_session(session, shared, synced_base=True)
            assert all(s["down"] is None and s["assigned"] > 0 for s in session.engine.server_status())
            loaded = session.engine._adapter
        # the servers outlive the run: closing it unloaded its adapter from them
        import httpx

        for proc in procs:
            again = httpx.post(
                f"{proc.url}/unload_lora_adapter",
                json={"lora_name": loaded},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=30,
            )
            assert again.status_code == 400 and "does not exist" in again.text, again.text

"""SGLang's own code as the contract: what we send SGLang, checked by SGLang's functions.

SGLang (the version the `sglang` extra pins) is imported from its unpacked wheel in a child process
(`sglang_wheel.py`, `sglang_checker.py`, which says what is stubbed and why). Checked:
- every launch command areal_nb builds parses with `sglang.srt.server_args.prepare_server_args`
  (the Session's launcher through `create_engine`, job.sbatch's GPU branch, benchmarks' calls);
- every /generate payload `SGLangEngine` builds passes SGLang's schema gate
  (`api_contract.generate_contract_error`) and `SamplingParams(...).verify()`;
- engine-server's 400s for wrong JSON types are rejected by SGLang's decoders too;
- engine-server's error bodies decode as SGLang's `GenerateStreamError` / `ErrorBody`;
- LoRA (`actor.lora`): the launch flags pass SGLang's parser and its LoRA launch check, and
  engine-server's parser takes the same flags; `lora_path` on /generate passes the schema gate;
  `SGLangEngine`'s `/load_lora_adapter` / `/unload_lora_adapter` bodies decode as SGLang's request
  types, and engine-server's answers on those routes as its `LoRAUpdateOutput`.
Each check is also shown failing on a deliberately wrong flag, payload or body.

Without the wheel (no network) these tests skip, saying why; under CI=true they fail instead.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch
from sglang_wheel import ROOT, unpacked_wheel

from areal_nb.api import GenerationConfig, ModelRequest, ModelResponse
from areal_nb.config import load_config
from areal_nb.engine import remote_launch
from areal_nb.engine.factory import create_engine
from areal_nb.engine.launcher import sglang_command
from areal_nb.engine.remote import _generate_payload, load_adapter_body, server_rid, unload_adapter_body
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.testing import ServedStub

# server: SGLang's code runs in a child Python process (its start is most of this module's time)
pytestmark = [pytest.mark.sglang_source, pytest.mark.server]

QWEN_VOCAB = 151_936


class SGLang:
    """The checker child process: `ask(op, **fields)` → its answer."""

    def __init__(self, site: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("sglang_checker.py")), str(site)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._stderr: list[str] = []
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()
        first = self.proc.stdout.readline()
        if not first:
            self.proc.wait(30)
            raise RuntimeError("the SGLang checker did not start:\n" + "".join(self._stderr[-40:]))
        self.version = json.loads(first)["ready"]
        self.lock = threading.Lock()

    def ask(self, op: str, **fields) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            answer = json.loads(self.proc.stdout.readline())
        assert not answer.get("crashed"), answer["error"]
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def sglang():
    try:
        site = unpacked_wheel()
    except RuntimeError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must check against SGLang's own code, but its wheel is missing: {exc}")
        pytest.skip(f"SGLang's wheel is not available here: {exc}")
    checker = SGLang(site)
    yield checker
    checker.close()


def _parses(sglang: SGLang, argv: list[str]) -> dict:
    answer = sglang.ask("server_args", argv=argv)
    assert answer["error"] is None, f"SGLang refuses {argv}: {answer['error']}"
    return answer["args"]


def _launch_args(cmd: list[str]) -> list[str]:
    i = cmd.index("sglang.launch_server")
    assert cmd[i - 1] == "-m"
    return cmd[i + 1 :]


# ---------------------------------------------------------------------- launch commands


class _Captured(Exception):
    pass


def record_launch_commands(monkeypatch) -> list[list[str]]:
    """Server launches go to a recorder: each command is kept in the returned list, and waiting for
    the server raises `_Captured` (nothing is started)."""
    commands: list[list[str]] = []

    class Recorder:
        def __init__(self, command, url, **_kw):
            commands.append(list(command))
            self.url = url

        def start(self):
            return self

        def wait_ready(self, **_kw):
            raise _Captured

        def stop(self):
            pass

    monkeypatch.setattr(remote_launch, "ServerProcess", Recorder)
    return commands


def test_the_session_launch_command_parses(sglang, monkeypatch, tmp_path):
    """The GPU config through the Session's path: create_engine → launch_remote_engine → the command."""
    commands = record_launch_commands(monkeypatch)
    cfg = load_config(
        ROOT / "configs" / "multi_turn_math_qwen1.5b.yaml",
        overrides={
            "engine.launch.n_servers": 2,
            "engine.launch.tp_size": 2,
            "engine.api_key": "secret",
            "engine.launch.extra_args": ["--random-seed", "0"],
        },
    )
    with pytest.raises(_Captured):
        create_engine(
            cfg.engine,
            None,
            None,
            model_path=str(tmp_path / "model"),
            weights_dir=str(tmp_path / "w"),
            dtype=getattr(torch, cfg.model.dtype),  # as the Session's builder passes it
        )
    assert len(commands) == 2
    for cmd in commands:
        args = _parses(sglang, _launch_args(cmd))
        assert args["max_running_requests"] == cfg.engine.max_batch_size == 128
        assert args["dtype"] == cfg.model.dtype == "bfloat16"
        assert args["tp_size"] == 2 and args["api_key"] == "secret" and args["random_seed"] == 0
        assert args["mem_fraction_static"] == cfg.engine.launch.mem_fraction_static
        assert args["weight_version"] == "0" and args["model_path"] == str(tmp_path / "model")


def _sbatch_sglang_argv() -> list[str]:
    """job.sbatch's `python -m sglang.launch_server ...` array, expanded by bash with sample values."""
    text = (ROOT / "areal_nb/export/templates/job.sbatch").read_text()
    match = re.search(r'server=\(("\$PYTHON" -m sglang\.launch_server.*?)\)\n\s*else', text, re.DOTALL)
    assert match, "job.sbatch has no sglang.launch_server command"
    script = (
        "PYTHON=python MODEL=/models/qwen port=30001 API_KEY=k GPUS_PER_SERVER=2 TP_SIZE=2 DP_SIZE=1 i=1 DTYPE=bfloat16 MAX_BATCH=64\n"
        f'server=({match.group(1)})\nprintf "%s\\0" "${{server[@]}}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return out.rstrip("\0").split("\0")


def test_the_job_sbatch_launch_command_parses(sglang):
    args = _parses(sglang, _launch_args(_sbatch_sglang_argv()))
    assert (args["port"], args["tp_size"], args["base_gpu_id"], args["host"]) == (30001, 2, 2, "0.0.0.0")
    assert (args["dtype"], args["max_running_requests"], args["dp_size"]) == ("bfloat16", 64, 1)


def _benchmark_sglang_commands() -> list[tuple[str, list[str]]]:
    """Every `sglang_command(...)` call in benchmarks/, with sample values for what it computes."""
    samples = {
        "port": 30002,
        "api_key": "k",
        "mem_fraction_static": 0.5,
        "host": "127.0.0.1",
        "tp_size": 1,
        "dp_size": 1,
        "weight_version": 0,
        "max_running_requests": 16,
    }
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sglang_command":
                kwargs = {}
                for kw in node.keywords:
                    try:
                        kwargs[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        assert kw.arg in samples, f"{path.name}: no sample value for {kw.arg}"
                        kwargs[kw.arg] = samples[kw.arg]
                found.append((f"{path.name}:{node.lineno}", sglang_command("/models/m", **kwargs)))
    return found


def test_the_benchmarks_launch_commands_parse(sglang):
    commands = _benchmark_sglang_commands()
    for _where, cmd in commands:
        _parses(sglang, _launch_args(cmd))
    if not commands:
        pytest.skip("no benchmark launches SGLang with sglang_command")


def test_a_wrong_flag_is_refused(sglang):
    # engine-server's name for the batch limit, given to SGLang by mistake
    cmd = sglang_command("/models/m", extra_args=["--max-batch-size", "8"])
    answer = sglang.ask("server_args", argv=_launch_args(cmd))
    assert "unrecognized arguments: --max-batch-size 8" in (answer["error"] or "accepted")
    answer = sglang.ask("server_args", argv=["--model-path", "/m", "--tp-size", "two"])
    assert "--tp-size" in (answer["error"] or "accepted") and "invalid int value" in answer["error"]


# ---------------------------------------------------------------------- /generate payloads


GCONFIGS = {
    "default": GenerationConfig(),
    "greedy": GenerationConfig(greedy=True, max_new_tokens=16),
    "sampled": GenerationConfig(temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=1024),
    "stops": GenerationConfig(stop=["</answer>", "\n\n"], stop_token_ids=[151645, 151643], max_new_tokens=64),
    "min-new": GenerationConfig(min_new_tokens=8, ignore_eos=True, max_new_tokens=32),
    "penalty": GenerationConfig(frequency_penalty=0.5, skip_special_tokens=False),
    "top-k-1": GenerationConfig(top_k=1, temperature=1.3),
}


@pytest.mark.parametrize("produced", [0, 5], ids=["first", "continued-after-pause"])
@pytest.mark.parametrize("name", list(GCONFIGS))
def test_every_generate_payload_passes_sglangs_contract(sglang, name, produced):
    g = GCONFIGS[name]
    payload = _generate_payload(
        list(range(3, 40)) + [7] * produced,
        g.max_new_tokens - produced,
        g,
        produced,
        server_rid("0" * 32, 12345),
    )
    answer = sglang.ask("generate", body=payload, vocab_size=QWEN_VOCAB)
    assert answer["error"] is None, (payload, answer["error"])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"max_tokens": 4}, "unknown field `max_tokens`"),
        ({"max_new_tokens": 4.0}, "invalid type: floating point `4.0`"),
        ({"temperature": -1.0}, "temperature must be a non-negative"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_a_wrong_payload_is_refused(sglang, change, expected):
    payload = _generate_payload([1, 2, 3], 8, GenerationConfig(), 0, "r")
    payload["sampling_params"].update(change)
    answer = sglang.ask("generate", body=payload, vocab_size=QWEN_VOCAB)
    assert answer["error"] is not None and expected in answer["error"], answer


# ---------------------------------------------------------------------- engine-server's 400s


def _engine_server_type_errors() -> list:
    from test_engine_server_strictness import _cases

    return [c for c in _cases() if c.values[0] in ("/generate", "/abort_request")]


def test_engine_servers_wrong_type_400s_are_refused_by_sglang_too(sglang):
    cases = _engine_server_type_errors()
    assert len(cases) > 100
    accepted = []
    for case in cases:
        route, body, _field = case.values
        if route == "/generate":
            answer = sglang.ask("generate", body=body, vocab_size=QWEN_VOCAB)
        else:
            answer = sglang.ask("abort", body=body)
        if answer["error"] is None:
            accepted.append(case.id)
    # SGLang's schema leaves these open (any JSON), engine-server refuses them as features it
    # does not implement, whatever their type
    open_fields = ("input_embeds", "custom_params", "watermark", "choice")
    assert [a for a in accepted if not any(f"{f}=" in a for f in open_fields)] == []


def test_the_decoder_refuses_what_engine_server_refuses(sglang):
    # the check above can fail: a body engine-server refuses that SGLang takes shows up
    assert sglang.ask("abort", body={"abort_all": True})["error"] is None
    assert sglang.ask("abort", body={"abort_all": "yes"})["error"] is not None
    ok = _generate_payload([1, 2, 3], 8, GenerationConfig(), 0, "r")
    assert sglang.ask("generate", body=ok, vocab_size=QWEN_VOCAB)["error"] is None


# ---------------------------------------------------------------------- error bodies


class _Failing(ServedStub):
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        if req.input_ids[0] == 99:
            raise RuntimeError("an engine bug")
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=[5],
            output_logprobs=[-1.0],
            output_versions=[0],
            stop_reason="length",
        )


def test_engine_server_error_bodies_have_sglangs_shape(sglang):
    app = create_engine_app(_Failing(), EngineServerSettings(max_body_bytes=4096))
    ok = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
    requests = [
        ("/generate", {**ok, "sampling_params": {"max_tokens": 1}}, 400),  # unknown key
        ("/generate", {**ok, "input_ids": []}, 400),
        ("/generate", {**ok, "return_logprob": "yes"}, 400),
        ("/generate", {**ok, "input_ids": list(range(5000))}, 413),
        ("/generate", {**ok, "input_ids": [99]}, 500),
        ("/abort_request", {"abort_all": "yes"}, 400),
        ("/pause_generation", {"mode": "sideways"}, 400),
        ("/update_weight_version", {"new_version": 3}, 400),
    ]

    async def run():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            return [await client.post(path, json=body) for path, body, _ in requests]

    import asyncio

    replies = asyncio.run(run())
    for (path, body, status), reply in zip(requests, replies, strict=True):
        assert reply.status_code == status, (path, body, reply.text)
        answer = sglang.ask("error_body", body=reply.json())
        assert answer["error"] is None, (path, reply.text, answer["error"])
        assert answer["code"] == status
    # the shape engine-server used before is refused by SGLang's types
    assert "expected struct ErrorBody" in sglang.ask("error_body", body={"error": "unknown field"})["error"]


# ---------------------------------------------------------------------- LoRA


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        ("all-linear", ["all"]),
        (["q_proj", "v_proj", "down_proj"], ["q_proj", "v_proj", "down_proj"]),
        (["self_attn.q_proj", "mlp.up_proj"], ["q_proj", "up_proj"]),  # peft's suffixes, SGLang's names
    ],
)
def test_the_lora_session_launch_command_parses_and_passes_sglangs_lora_check(
    sglang, monkeypatch, tmp_path, targets, expected
):
    from areal_nb.cli.engine_server import build_parser, lora_settings
    from areal_nb.train.lora import LoraConfig

    commands = record_launch_commands(monkeypatch)
    cfg = load_config(ROOT / "configs" / "multi_turn_math_qwen1.5b.yaml")
    lora = LoraConfig(r=16, alpha=32.0, target_modules=targets)
    with pytest.raises(_Captured):
        create_engine(
            cfg.engine, None, None, model_path=str(tmp_path / "m"), weights_dir=str(tmp_path / "w"), lora=lora
        )
    args = _parses(sglang, _launch_args(commands[0]))
    assert (args["enable_lora"], args["max_lora_rank"], args["max_loras_per_batch"]) == (True, 16, 2)
    assert sorted(args["lora_target_modules"]) == sorted(expected)
    # engine-server reads the same flags the same way
    i = commands[0].index("--enable-lora")
    ours = lora_settings(build_parser().parse_args(commands[0][i:]))
    assert (ours.max_lora_rank, ours.target_modules, ours.max_loras_per_batch) == (16, expected, 2)


def test_wrong_lora_flags_are_refused_by_sglang_and_engine_server_alike(sglang):
    from areal_nb.cli.engine_server import build_parser, lora_settings

    half = ["--enable-lora", "--max-lora-rank", "8"]  # no target modules and no adapters to infer them
    answer = sglang.ask("server_args", argv=["--model-path", "/m", *half])
    assert "you need to specify both --max-lora-rank and --lora-target-modules" in (
        answer["error"] or "accepted"
    )
    with pytest.raises(
        ValueError, match="you need to specify both --max-lora-rank and --lora-target-modules"
    ):
        lora_settings(build_parser().parse_args(half))
    wrong = ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "c_attn"]
    answer = sglang.ask("server_args", argv=["--model-path", "/m", *wrong])
    assert "invalid choice: 'c_attn'" in (answer["error"] or "accepted")
    with pytest.raises(SystemExit):
        build_parser().parse_args(wrong)


def test_generate_payloads_naming_an_adapter_pass_sglangs_contract(sglang):
    payload = _generate_payload([1, 2, 3], 8, GenerationConfig(), 0, "r", lora_path="policy-v3-0a1b2c3d-0")
    assert payload["lora_path"] == "policy-v3-0a1b2c3d-0"
    assert sglang.ask("generate", body=payload, vocab_size=QWEN_VOCAB)["error"] is None
    payload["lora_path"] = 3
    answer = sglang.ask("generate", body=payload, vocab_size=QWEN_VOCAB)
    assert "expected a value or an array of values for OptionalStringOrList" in (
        answer["error"] or "accepted"
    )


def test_adapter_load_and_unload_bodies_decode_as_sglangs_requests(sglang):
    load = load_adapter_body("policy-v1-x-0", "/shared/weights/adapter-1")
    answer = sglang.ask("lora_request", route="/load_lora_adapter", body=load)
    assert answer["error"] is None and answer["lora_name"] == "policy-v1-x-0"
    answer = sglang.ask(
        "lora_request", route="/unload_lora_adapter", body=unload_adapter_body("policy-v1-x-0")
    )
    assert answer["error"] is None and answer["lora_name"] == "policy-v1-x-0"
    wrong = sglang.ask("lora_request", route="/load_lora_adapter", body={"lora_name": "a"})  # no path
    assert "lora_path" in (wrong["error"] or "accepted")


def test_engine_servers_lora_answers_are_sglangs_lora_update_output(sglang, tmp_path):
    from transformers import AutoModelForCausalLM

    from areal_nb.engine import LocalEngine
    from areal_nb.engine.lora_flags import LoraSettings
    from areal_nb.models import resolve_model_path
    from areal_nb.train.lora import LoraConfig, wrap_lora

    path = resolve_model_path("tiny-math")
    wrap_lora(AutoModelForCausalLM.from_pretrained(str(path)), LoraConfig(r=4)).save_pretrained(
        tmp_path / "a"
    )
    lora = LoraSettings(max_lora_rank=8, target_modules=["all"])
    with LocalEngine(str(path), device="cpu") as engine:
        apps = [
            create_engine_app(engine, EngineServerSettings(weights_dir=str(tmp_path), lora=lora)),
            create_engine_app(engine, EngineServerSettings(weights_dir=str(tmp_path))),  # LoRA off
        ]
        calls = [
            (0, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}, 200),
            (0, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}, 400),  # already loaded
            (0, "/unload_lora_adapter", {"lora_name": "a"}, 200),
            (0, "/unload_lora_adapter", {"lora_name": "a"}, 400),  # no longer loaded
            (1, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}, 400),
        ]

        async def run():
            replies = []
            for app_index, route, body, _ in calls:
                transport = httpx.ASGITransport(app=apps[app_index])
                async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
                    replies.append(await client.post(route, json=body))
            return replies

        import asyncio

        replies = asyncio.run(run())
    for (_, route, body, status), reply in zip(calls, replies, strict=True):
        assert reply.status_code == status, (route, body, reply.text)
        assert sglang.ask("lora_reply", body=reply.json())["error"] is None, reply.text
    # the check can fail: a reply without SGLang's fields is refused
    assert (
        "not a LoRAUpdateOutput" in sglang.ask("lora_reply", body={"success": True, "message": ""})["error"]
    )

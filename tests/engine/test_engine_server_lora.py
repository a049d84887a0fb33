"""`areal-nb engine-server` serves LoRA adapters through SGLang's API: `/load_lora_adapter`,
`/unload_lora_adapter`, `lora_path` on `/generate`, with SGLang's answers for what it refuses.

The adapter folders are written by peft's own `save_pretrained` on the tiny model; the reference
for every served log-prob is peft's base + adapter forward (the trainer's computation)."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import pytest
import torch
from engine_test_helpers import teacher_forced_logprobs

from areal_nb.engine import LocalEngine
from areal_nb.engine.lora_flags import LoraSettings
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.engine.weight_sync import write_weights
from areal_nb.models import resolve_model_path
from areal_nb.train.lora import LoraConfig, lora_base, wrap_lora

PROMPT = [5, 17, 42, 99, 7, 31]
RANK = 4


def _reference():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(resolve_model_path("tiny-math")), dtype=torch.float32
    ).eval()


def _adapter(seed: int, targets="all-linear", rank: int = RANK):
    """A peft model on tiny-math whose adapter changes the outputs (B is random, not peft's zeros)."""
    model = wrap_lora(_reference(), LoraConfig(r=rank, alpha=2.0 * rank, target_modules=targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters saved by peft under a weights folder, and the models that made them."""
    root = tmp_path_factory.mktemp("weights")
    models = {"one": _adapter(1), "two": _adapter(2, targets=["q_proj", "v_proj"])}
    for name, model in models.items():
        model.save_pretrained(root / name)
    return root, models


@pytest.fixture
def engine():
    engine = LocalEngine(str(resolve_model_path("tiny-math")), device="cpu", seed=0)
    yield engine
    engine.close()


def _settings(root, **lora):
    lora = {"max_lora_rank": 8, "target_modules": ["all"], **lora}
    return EngineServerSettings(weights_dir=str(root), lora=LoraSettings(**lora))


def _run(app, calls):
    """Send `calls` ((method, path, body), ...) in order; their replies."""

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine", timeout=120) as client:
            return [await client.request(m, path, json=body) for m, path, body in calls]

    return asyncio.run(run())


def _generate(lora_path=None, prompt=PROMPT):
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.8, "ignore_eos": True},
        "return_logprob": True,
    }
    if lora_path is not None:
        body["lora_path"] = lora_path
    return ("POST", "/generate", body)


def _max_error(model, reply) -> float:
    triples = reply.json()["meta_info"]["output_token_logprobs"]
    output = [t[1] for t in triples]
    ref = teacher_forced_logprobs(model, PROMPT, output, temperature=0.8)
    return float((ref - torch.tensor([t[0] for t in triples])).abs().max())


def test_generate_with_a_loaded_adapter_serves_base_plus_adapter(engine, adapters):
    root, models = adapters
    app = create_engine_app(engine, _settings(root))
    replies = _run(
        app,
        [
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": str(root / "one")}),
            ("POST", "/load_lora_adapter", {"lora_name": "two", "lora_path": "two"}),  # relative to weights
            _generate("one"),
            _generate("two"),
            _generate(None),
            _generate("one"),
        ],
    )
    load_one, load_two, one, two, base, one_again = replies
    assert load_one.status_code == 200, load_one.text
    assert load_one.json() == {
        "rid": None,
        "http_worker_ipc": None,
        "success": True,
        "error_message": "",
        "loaded_adapters": {"one": str(root / "one")},
    }
    assert load_two.json()["loaded_adapters"] == {"one": str(root / "one"), "two": str(root / "two")}
    for reply in (one, two, base, one_again):
        assert reply.status_code == 200, reply.text
    assert _max_error(models["one"], one) < 1e-4
    assert _max_error(models["two"], two) < 1e-4
    with models["one"].disable_adapter():
        assert _max_error(models["one"], base) < 1e-4  # the base again, after two adapters
    assert _max_error(models["one"], one_again) < 1e-4
    # the adapters change the outputs enough that serving the wrong one would be seen
    assert _max_error(models["two"], one) > 1e-2


def test_unknown_adapters_and_a_server_without_lora_get_sglangs_answers(engine, adapters):
    root, _ = adapters
    plain = create_engine_app(engine, EngineServerSettings(weights_dir=str(root)))
    load, unload, generate = _run(
        plain,
        [
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": str(root / "one")}),
            ("POST", "/unload_lora_adapter", {"lora_name": "one"}),
            _generate("one"),
        ],
    )
    off = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
    for reply in (load, unload):
        assert reply.status_code == 400
        assert reply.json() == {
            "rid": None,
            "http_worker_ipc": None,
            "success": False,
            "error_message": off,
            "loaded_adapters": None,
        }
    assert generate.status_code == 400
    assert generate.json()["error"]["message"] == (
        "LoRA adapter 'one' was requested, but LoRA is not enabled. Please launch the server with "
        "--enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint."
    )

    app = create_engine_app(engine, _settings(root))
    replies = _run(
        app,
        [
            _generate("nope"),
            ("POST", "/unload_lora_adapter", {"lora_name": "nope"}),
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": "one"}),
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": "two"}),
            ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/etc"}),
            ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": 3}),
            (
                "POST",
                "/generate",
                {**_generate()[2], "input_ids": [PROMPT, PROMPT], "lora_path": ["one", None]},
            ),
        ],
    )
    never, unload_unknown, load_ok, twice, outside, wrong_type, mixed = replies
    assert never.status_code == 400
    assert never.json()["error"]["message"] == (
        "Got LoRA adapter that has never been loaded: nope\nAll loaded adapters: dict_keys([])."
    )
    assert unload_unknown.status_code == 400
    assert unload_unknown.json()["error_message"] == (
        "LoRA with name nope does not exist. Loaded LoRAs: odict_keys([])"
    )
    assert load_ok.status_code == 200
    assert twice.status_code == 400
    assert twice.json()["error_message"] == "Failed to load LoRA adapter one because it is already loaded"
    assert twice.json()["loaded_adapters"] == {"one": str(root / "one")}
    assert (
        outside.status_code == 400
        and "outside the allowed weights directory" in outside.json()["error_message"]
    )
    assert wrong_type.status_code == 400  # a path must be a JSON string (SGLang's decoder agrees)
    assert mixed.status_code == 400 and "one LoRA adapter" in mixed.json()["error"]["message"]


def test_flags_limit_what_loads(engine, adapters):
    root, _ = adapters
    app = create_engine_app(engine, _settings(root, max_lora_rank=2, target_modules=["q_proj"]))
    big, outside_targets = _run(
        app,
        [
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": "one"}),  # rank 4 > 2
            ("POST", "/load_lora_adapter", {"lora_name": "two", "lora_path": "two"}),
        ],
    )
    message = (
        "LoRA adapter {} with rank 4 is incompatible with the current LoRA memory pool configuration. "
        "Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` and that "
        "the target modules are included in `--lora-target-modules`."
    )
    assert big.status_code == 400 and big.json()["error_message"] == message.format("one")
    assert outside_targets.status_code == 400 and outside_targets.json()["error_message"] == message.format(
        "two"
    )
    # q_proj admits k_proj and v_proj (SGLang compares the fused qkv_proj)
    app = create_engine_app(engine, _settings(root, target_modules=["q_proj"]))
    (ok,) = _run(app, [("POST", "/load_lora_adapter", {"lora_name": "two", "lora_path": "two"})])
    assert ok.status_code == 200, ok.text
    with pytest.raises(ValueError, match="specify both --max-lora-rank and --lora-target-modules"):
        LoraSettings(max_lora_rank=8)
    # a damaged folder is refused and loads nothing
    bad = root / "damaged"
    shutil.copytree(root / "one", bad, dirs_exist_ok=True)
    (bad / "adapter_model.safetensors").write_bytes(b"not safetensors")
    (reply,) = _run(app, [("POST", "/load_lora_adapter", {"lora_name": "bad", "lora_path": "damaged"})])
    assert reply.status_code == 400 and "cannot read the adapter weights" in reply.json()["error_message"]
    assert reply.json()["loaded_adapters"] == {"two": str(root / "two")}


def test_lora_paths_load_at_start_and_an_unloaded_name_is_loaded_again_on_use(engine, adapters):
    root, models = adapters
    app = create_engine_app(engine, _settings(root, lora_paths={"one": str(root / "one")}))
    unload, again, unload_again, load = _run(
        app,
        [
            ("POST", "/unload_lora_adapter", {"lora_name": "one"}),
            _generate("one"),  # SGLang loads a name it had loaded before from its path again
            ("POST", "/unload_lora_adapter", {"lora_name": "one"}),
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": "two"}),  # the name, new weights
        ],
    )
    assert unload.status_code == 200 and unload.json()["loaded_adapters"] == {}
    assert again.status_code == 200 and _max_error(models["one"], again) < 1e-4
    assert unload_again.status_code == 200 and load.status_code == 200
    (now,) = _run(app, [_generate("one")])
    assert _max_error(models["two"], now) < 1e-4  # the name's new adapter, not the one applied before


def test_a_base_update_keeps_the_adapter_on_top(engine, adapters):
    root, models = adapters
    app = create_engine_app(engine, _settings(root))
    base = _reference()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.01)
    folder = write_weights(root, 7, base.state_dict())
    replies = _run(
        app,
        [
            ("POST", "/load_lora_adapter", {"lora_name": "one", "lora_path": "one"}),
            _generate("one"),
            ("POST", "/update_weights_from_disk", {"model_path": str(folder), "weight_version": "7"}),
            _generate("one"),
            _generate(None),
        ],
    )
    assert [r.status_code for r in replies] == [200] * 5, [r.text for r in replies]
    # the new base + adapter one: peft's adapter on the updated base
    updated = wrap_lora(base, LoraConfig(r=RANK, alpha=2.0 * RANK)).eval()
    lora_base(updated).load_state_dict(
        {k: v for k, v in lora_base(models["one"]).state_dict().items() if "lora_" in k}, strict=False
    )
    assert _max_error(updated, replies[3]) < 1e-4
    assert replies[3].json()["meta_info"]["weight_version"] == "7"
    with updated.disable_adapter():
        assert _max_error(updated, replies[4]) < 1e-4


@pytest.mark.server
def test_sglang_engine_pushes_versioned_adapters_and_unloads_the_previous(engine, tmp_path):
    from areal_nb.api import GenerationConfig, ModelRequest
    from areal_nb.engine.remote import EngineServerError, SGLangEngine
    from areal_nb.proxy.server import ProxyServer
    from areal_nb.train.lora import lora_adapter

    weights = tmp_path / "weights"
    weights.mkdir()
    app = create_engine_app(engine, _settings(weights))
    request = ModelRequest(PROMPT, GenerationConfig(max_new_tokens=8, temperature=0.8, ignore_eos=True))
    with (
        ProxyServer(app, port=0) as served,
        SGLangEngine([served.url], weights_dir=weights, lora=True) as remote,
    ):
        models = [_adapter(1), _adapter(2)]
        for version, model in enumerate(models, start=1):
            remote.update_weights(lora_adapter(model), version=version)
            out = asyncio.run(remote.agenerate(request))
            ref = teacher_forced_logprobs(model, out.input_tokens, out.output_tokens, temperature=0.8)
            assert float((ref - torch.tensor(out.output_logprobs)).abs().max()) < 1e-4, version
            assert out.output_versions == [version] * 8
            loaded = app.app.state.engine_app.serving.adapters.loaded  # the previous one unloaded
            assert list(loaded) == [remote._adapter] and remote._adapter.startswith(f"policy-v{version}-")
        assert sorted(p.name for p in weights.iterdir()) == ["adapter-1", "adapter-2"]
        assert {p.name for p in (weights / "adapter-2").iterdir()} == {
            "adapter_config.json",
            "adapter_model.safetensors",
        }

    # servers started without --enable-lora: a clear error at once, not retries until weights_wait
    plain = create_engine_app(engine, EngineServerSettings(weights_dir=str(weights)))
    with ProxyServer(plain, port=0) as served:
        with SGLangEngine([served.url], weights_dir=weights, lora=True, weights_wait=600) as remote:
            with pytest.raises(EngineServerError, match="serves no LoRA adapters.*--enable-lora"):
                remote.update_weights(lora_adapter(models[0]), version=3)
        with SGLangEngine([served.url], weights_dir=weights) as remote:
            with pytest.raises(ValueError, match="not made for LoRA adapters"):
                remote.update_weights(lora_adapter(models[0]), version=3)


class _Adapters:
    """The adapter gate's view of `AdapterServing`: which adapter the weights hold, and the switches."""

    def __init__(self) -> None:
        self.applied = None
        self.switches: list = []

    def switch(self, adapter) -> None:
        self.switches.append(adapter)
        self.applied = adapter


def test_the_adapter_gate_switches_once_the_batch_drains_first_come_first_served():
    from areal_nb.engine.server_app import _ServingState

    async def run():
        adapters = _Adapters()
        state = _ServingState(engine=None, adapters=adapters)
        a, b = object(), object()
        await state.admit(["a1"], a)  # idle: switches to a at once
        entered: list[str] = []

        async def request(rid, adapter):
            await state.admit([rid], adapter)
            entered.append(rid)

        waiting_b = asyncio.create_task(request("b1", b))
        await asyncio.sleep(0.01)
        late_a = asyncio.create_task(request("a2", a))  # same adapter as the batch, but after b1
        await asyncio.sleep(0.01)
        assert entered == [] and adapters.switches == [a]  # b1 waits for a1; a2 waits behind b1
        await state.release("a1")
        await asyncio.sleep(0.01)
        assert entered == ["b1"] and adapters.switches == [a, b]
        await state.release("b1")
        await asyncio.gather(waiting_b, late_a)
        assert entered == ["b1", "a2"] and adapters.switches == [a, b, a]
        # a waiter that leaves (its client gone) lets those behind it go
        gone = asyncio.create_task(request("b2", b))
        await asyncio.sleep(0.01)
        behind = asyncio.create_task(request("a3", a))
        await asyncio.sleep(0.01)
        assert entered == ["b1", "a2"]
        gone.cancel()
        await behind
        assert entered == ["b1", "a2", "a3"] and adapters.switches == [a, b, a]

    asyncio.run(run())

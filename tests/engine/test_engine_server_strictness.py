"""engine-server bad input, swept over the whole surface: a 4xx naming the field, never a 5xx.

The cases are generated from the routes' own request schemas (`native_api`'s pydantic models):
every field of every route gets every JSON type its schema does not allow (and an array of a wrong
element type where it takes arrays). Weight updates get every path shape a file system can refuse
and every kind of damaged weights folder. After each case the server still serves, its weights and
version are unchanged; after all of them a /generate gives the same tokens as before. A failure
nobody foresaw (an engine bug) is a 500 with its traceback logged, and the server serves on.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import time

import httpx
import pytest
import torch

from areal_nb.engine import LocalEngine
from areal_nb.engine.native_api import (
    AbortRequest,
    GenerateRequest,
    PauseRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightVersionRequest,
    _NullIsDefault,
)
from areal_nb.engine.server_app import EngineServerSettings, create_engine_app
from areal_nb.engine.weight_sync import write_weights
from areal_nb.proxy.server import ProxyServer

pytestmark = pytest.mark.server

PROMPT = [5, 17, 42, 99, 7, 31]
GREEDY = {
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True},
}

# one value of each JSON type
JSON_VALUES = {
    "null": None,
    "boolean": True,
    "integer": 7,
    "number": 0.5,
    "string": "yes",
    "array": [1],
    "object": {"a": 1},
}
ITEM_VALUES = {"integer": 7, "number": 0.5, "string": "yes", "boolean": True, "object": {"a": 1}}


def _allowed(schema: dict, defs: dict) -> tuple[set[str], set[str] | None]:
    """The JSON types a field's schema takes, and (for arrays) the types its items take."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        kinds: set[str] = set()
        items: set[str] | None = None
        for option in schema["anyOf"]:
            k, i = _allowed(option, defs)
            kinds |= k
            if i is not None:
                items = (items or set()) | i
        return kinds, items
    kind = schema.get("type")
    if kind is None:
        return set(JSON_VALUES), None  # Any
    kinds = {kind} | ({"integer"} if kind == "number" else set())
    items = None
    if kind == "array" and "items" in schema:
        items = _allowed(schema["items"], defs)[0]
    return kinds, items


def _wrong_values(model) -> list[tuple[str, object]]:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    cases = []
    for field, spec in schema["properties"].items():
        kinds, items = _allowed(spec, defs)
        if issubclass(model, _NullIsDefault):
            kinds.add("null")  # null is the field's default there (as in SGLang)
        cases += [(field, value) for kind, value in JSON_VALUES.items() if kind not in kinds]
        if items is not None and items != set(JSON_VALUES):
            cases += [
                (field, [value])
                for kind, value in ITEM_VALUES.items()
                if kind not in items and not (kind == "integer" and "number" in items)
            ]
    return cases


# (route, a valid body, the model whose fields are swept, where in the body they go)
ROUTES = [
    ("/generate", GREEDY, GenerateRequest, None),
    ("/generate", GREEDY, SamplingParams, "sampling_params"),
    ("/abort_request", {"rid": "nobody"}, AbortRequest, None),
    ("/pause_generation", {"mode": "abort"}, PauseRequest, None),
    ("/update_weights_from_disk", {"model_path": "version-1"}, UpdateWeightsFromDiskRequest, None),
    (
        "/update_weight_version",
        {"new_version": "0", "abort_all_requests": False},
        UpdateWeightVersionRequest,
        None,
    ),
]


def _cases() -> list:
    cases = []
    for route, base, model, where in ROUTES:
        for field, value in _wrong_values(model):
            if where is None:
                body = {**base, field: value}
            else:
                body = {**base, where: {**base[where], field: value}}
            cases.append(
                pytest.param(
                    route, body, field, id=f"{route[1:]}-{where + '.' if where else ''}{field}={value!r}"
                )
            )
    for route in {r[0] for r in ROUTES} | {"/continue_generation"}:
        for kind in ("array", "string", "integer", "null"):  # a body that is not an object at all
            cases.append(pytest.param(route, JSON_VALUES[kind], "body", id=f"{route[1:]}-body={kind}"))
    return cases


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("strict")
    weights = root / "weights"
    weights.mkdir()
    engine = LocalEngine(tiny_model_path, seed=0)
    server = ProxyServer(create_engine_app(engine, EngineServerSettings(weights_dir=str(weights))), port=0)
    server.start()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        expected = client.post("/generate", json=GREEDY).json()["output_ids"]
        yield client, engine, weights, expected
    server.stop()
    engine.close()


def _serves_as_before(client, engine, expected) -> None:
    reply = client.post("/generate", json=GREEDY)
    assert reply.status_code == 200 and reply.json()["output_ids"] == expected, reply.text
    assert engine.get_version() == 0 and client.get("/server_info").json()["paused"] is False


@pytest.mark.parametrize(("route", "body", "field"), _cases())
def test_a_wrong_json_type_is_a_4xx_naming_the_field(served, route, body, field):
    client, engine, _, expected = served
    reply = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    error = (
        reply.json().get("message")
        if route == "/update_weights_from_disk" and "success" in reply.json()
        else reply.json()["error"]["message"]
    )
    assert field in error or (field == "body" and "JSON object" in error), error
    _serves_as_before(client, engine, expected)


def test_the_sweep_covers_every_flag_and_count():
    bodies = [(c.values[0], c.values[1]) for c in _cases() if isinstance(c.values[1], dict)]
    for route, flag in [
        ("/abort_request", "abort_all"),
        ("/update_weights_from_disk", "abort_all_requests"),
        ("/update_weights_from_disk", "flush_cache"),
        ("/update_weights_from_disk", "keep_pause"),
        ("/update_weight_version", "abort_all_requests"),
    ]:
        assert any(r == route and b.get(flag) == "yes" for r, b in bodies), (route, flag)
    assert any(
        isinstance(b.get("sampling_params"), dict) and b["sampling_params"].get("max_new_tokens") == 0.5
        for _, b in bodies
    )  # a count that is not an integer


def _weight_folders(root, reference_model) -> dict[str, str]:
    """Every weights-path shape a server must refuse with a 4xx: name → model_path."""
    good = write_weights(root, 50, reference_model)
    shapes: dict[str, str] = {}
    loop = root / "loop"
    os.symlink(loop, loop)  # a link to itself: resolving it never ends
    shapes["symlink-loop"] = str(loop)
    shapes["nul-byte"] = str(root / "version\x00-1")
    shapes["5000-char-name"] = str(root / ("v" * 5000))
    shapes["long-path"] = str(root / "/".join(["d" * 200] * 30))
    shapes["a-file"] = str(good / "config.json")
    shapes["missing"] = str(root / "version-404")
    size = (good / "model.safetensors").stat().st_size
    for name, damage in [
        ("truncated", lambda f: f.write_bytes(f.read_bytes()[: size // 2])),
        ("empty", lambda f: f.write_bytes(b"")),
        ("random", lambda f: f.write_bytes(os.urandom(4096))),
        ("header-only", lambda f: f.write_bytes(f.read_bytes()[:64])),
    ]:
        folder = root / f"damaged-{name}"
        shutil.copytree(good, folder)
        damage(folder / "model.safetensors")
        shapes[f"{name}-safetensors"] = str(folder)
    pickled = root / "pickled-bin"
    pickled.mkdir()
    shutil.copy(good / "config.json", pickled / "config.json")

    class Boom:  # a pickle that would run code if loaded without weights_only
        def __reduce__(self):
            return (os.system, ("touch " + str(root / "pwned"),))

    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": Boom()}))
    shapes["pickled-bin"] = str(pickled)
    not_tensors = root / "list-bin"
    not_tensors.mkdir()
    torch.save([torch.zeros(2)], not_tensors / "pytorch_model.bin")
    shapes["bin-of-a-list"] = str(not_tensors)
    shutil.rmtree(good)
    return shapes


def test_every_refused_weights_path_is_a_4xx_and_keeps_the_weights(served, reference_model):
    client, engine, weights, expected = served
    shapes = _weight_folders(weights, reference_model)
    for name, path in shapes.items():
        body = json.dumps({"model_path": path, "weight_version": "5"})  # json.dumps keeps the NUL as \u0000
        reply = client.post(
            "/update_weights_from_disk", content=body, headers={"content-type": "application/json"}
        )
        assert 400 <= reply.status_code < 500, (name, reply.status_code, reply.text[:300])
        answer = reply.json()
        assert answer["success"] is False and answer["message"], (name, answer)
        assert len(answer["message"]) < 1000, (name, len(answer["message"]))
        if name.endswith(("-safetensors", "-bin")):  # the damaged file is named
            assert path in answer["message"], (name, answer["message"])
        _serves_as_before(client, engine, expected)
    assert not (weights / "pwned").exists()


def test_an_unforeseen_failure_is_logged_a_500_and_the_server_serves_on(
    served, reference_model, caplog, monkeypatch
):
    client, engine, weights, expected = served
    path = write_weights(weights, 60, reference_model)

    def broken(*_args, **_kwargs):
        raise RuntimeError("an engine bug")

    monkeypatch.setattr(engine, "update_weights", broken)
    server_log = logging.getLogger("uvicorn.error")  # where the server logs a route's exception
    # a logging.config.dictConfig elsewhere in the process may have disabled existing loggers
    monkeypatch.setattr(server_log, "disabled", False)
    server_log.addHandler(caplog.handler)
    try:
        reply = client.post(
            "/update_weights_from_disk", json={"model_path": str(path), "weight_version": "1"}
        )
        # the server logs the traceback just after it has answered
        deadline = time.monotonic() + 30
        while "an engine bug" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server_log.removeHandler(caplog.handler)
    assert reply.status_code == 500 and reply.json() == {
        "error": {"message": "Internal Server Error", "code": 500}
    }
    assert "an engine bug" in caplog.text  # the traceback went to the log, not to the client
    monkeypatch.undo()
    _serves_as_before(client, engine, expected)
    # the update lock was released: a real update goes through
    ok = client.post("/update_weights_from_disk", json={"model_path": str(path), "weight_version": "0"})
    assert ok.status_code == 200 and ok.json()["success"] is True


def test_null_is_a_fields_default_as_in_sglang(served):
    client, _, _, expected = served
    body = {
        "input_ids": PROMPT,
        "stream": None,
        "return_logprob": None,
        "top_logprobs_num": None,
        "sampling_params": {
            **GREEDY["sampling_params"],
            "top_p": None,
            "top_k": None,
            "n": None,
            "skip_special_tokens": None,
            "min_new_tokens": None,
        },
    }
    reply = client.post("/generate", json=body)
    assert reply.status_code == 200 and reply.json()["output_ids"] == expected, reply.text
    assert "output_token_logprobs" not in reply.json()["meta_info"]  # return_logprob null: its default, false


def test_a_request_id_used_twice_is_a_400_and_the_server_serves_on(served):
    client, _, _, expected = served
    body = {**GREEDY, "input_ids": [PROMPT, PROMPT], "rid": ["same", "same"]}
    reply = client.post("/generate", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == "Duplicate request ID detected: 'same'"
    # nothing of the refused batch stays in flight: the id can be used again at once
    again = client.post("/generate", json={**GREEDY, "rid": "same"})
    assert again.status_code == 200 and again.json()["output_ids"] == expected, again.text

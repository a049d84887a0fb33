"""The SGLang native-API contract, one module for every server that claims to speak it.

"engine-server" is `areal-nb engine-server` started here as a real subprocess on loopback with the
tiny-math model; "sglang" is a real SGLang server whose address the device check passes in
(`benchmarks/gpu_check.sh`, variables in `servers.py`). Both are driven over raw HTTP (the wire
contract: fields, finish reasons, 400s) and through `SGLangEngine` (what the trainer uses).
Tests run in file order on one server per parametrization; each one leaves it unpaused.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import httpx
import pytest
import torch
from servers import (
    ServerUnderTest,
    engine_server_under_test,
    error_text,
    load_reference,
    perturbed_copy,
    sglang_under_test,
    teacher_forced,
    write_new_version,
)

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine.remote import SGLangEngine

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 42, 99, 7, 31]


@pytest.fixture(scope="module", params=["engine-server", "sglang"])
def server(request, tmp_path_factory):
    if request.param == "sglang":
        found = sglang_under_test()
        if found is None:
            pytest.skip("set AREAL_NB_SGLANG_URL (benchmarks/gpu_check.sh does) to run against real SGLang")
        yield found
        return
    found = engine_server_under_test(tmp_path_factory.mktemp("engine-server"))
    yield found
    found.process.stop()


@pytest.fixture(scope="module")
def weights(server):
    """The model the server currently serves (tests that update weights replace it)."""
    return {"model": load_reference(server.model_path)}


def _generate(server: ServerUnderTest, body: dict, timeout: float = 300.0) -> httpx.Response:
    with server.client(timeout) as client:
        return client.post("/generate", json=body)


def _greedy(max_new: int, **extra) -> dict:
    return {"max_new_tokens": max_new, "temperature": 0.0, **extra}


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def _engine(server: ServerUnderTest, **kw) -> SGLangEngine:
    return SGLangEngine([server.url], api_key=server.api_key, weights_dir=server.weights_dir, **kw)


# ---------------------------------------------------------------------- generation


def test_generate_returns_tokens_logprobs_and_the_weight_version(server, weights):
    response = _generate(
        server, {"input_ids": PROMPT, "sampling_params": _greedy(8, ignore_eos=True), "return_logprob": True}
    )
    assert response.status_code == 200, response.text
    out = response.json()
    meta = out["meta_info"]
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"] and len(out["output_ids"]) == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == 8
    assert isinstance(out["text"], str)
    assert meta["weight_version"] == server.version()
    if "weight_versions" in meta:  # sglang >= 0.5.20
        assert meta["weight_versions"] == [{"version": meta["weight_version"], "start": 0, "end": 8}]
    # greedy log-probs are log_softmax(logits) of the tokens, recomputed here by teacher forcing
    reference = teacher_forced(weights["model"], PROMPT, out["output_ids"])
    assert (reference - torch.tensor([t[0] for t in triples])).abs().max().item() < server.logprob_tol
    # a batch answers a list in input order, each item its own rid
    batch = _generate(
        server,
        {
            "input_ids": [PROMPT, PROMPT[:3]],
            "rid": ["b0", "b1"],
            "sampling_params": _greedy(4, ignore_eos=True),
            "return_logprob": True,
        },
    ).json()
    assert [item["meta_info"]["id"] for item in batch] == ["b0", "b1"]
    assert batch[0]["output_ids"] == out["output_ids"][:4]


def test_stop_reasons_and_the_stop_token_is_kept(server):
    free = _generate(
        server, {"input_ids": PROMPT, "sampling_params": _greedy(12, ignore_eos=True), "return_logprob": True}
    ).json()["output_ids"]
    # the last token seen for the first time (a random-init model may repeat one token: then k = 0)
    k = max(i for i in range(len(free)) if free[i] not in free[:i])
    stopped = _generate(
        server,
        {
            "input_ids": PROMPT,
            "return_logprob": True,
            "sampling_params": _greedy(12, ignore_eos=True, stop_token_ids=[free[k]]),
        },
    ).json()
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[k]}
    assert stopped["output_ids"] == free[: k + 1]  # output runs "through stop"

    engine = _engine(server)
    try:
        g = GenerationConfig(max_new_tokens=12, greedy=True, ignore_eos=True)
        length = asyncio.run(engine.agenerate(ModelRequest(list(PROMPT), g)))
        stop = asyncio.run(engine.agenerate(ModelRequest(list(PROMPT), g.new(stop_token_ids=[free[k]]))))
    finally:
        engine.close()
    assert (length.stop_reason, length.output_tokens) == ("length", free)
    assert (stop.stop_reason, stop.output_tokens) == ("stop", free[: k + 1])


def test_abort_request_returns_partial_output(server):
    rid = uuid.uuid4().hex
    body = {
        "input_ids": PROMPT,
        "rid": rid,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": server.long_tokens, "ignore_eos": True},
    }
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=_generate(server, body)))
    thread.start()
    with server.client() as client:
        while thread.is_alive():  # an abort for a rid not yet registered is ignored: repeat it
            assert client.post("/abort_request", json={"rid": rid}).status_code == 200
            thread.join(0.02)
    out = result["r"].json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < server.long_tokens
    assert len(out["meta_info"].get("output_token_logprobs", [])) == len(out["output_ids"])


def test_client_abort_returns_stop_reason_abort(server):
    engine = _engine(server)
    req = ModelRequest(list(PROMPT), GenerationConfig(max_new_tokens=server.long_tokens, ignore_eos=True))

    async def run():
        task = asyncio.ensure_future(engine.agenerate(req))
        while not task.done():
            await engine.aabort(req.rid)
            await asyncio.wait({task}, timeout=0.02)
        return task.result()

    try:
        response = asyncio.run(run())
    finally:
        engine.close()
    assert response.stop_reason == "abort" and response.output_len < server.long_tokens
    assert len(response.output_logprobs) == len(response.output_versions) == response.output_len


def test_pause_aborts_in_flight_holds_new_requests_and_continue_releases_them(server):
    long_body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": server.long_tokens, "ignore_eos": True},
    }
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(_generate(server, long_body))) for _ in range(4)
    ]
    before = server.admitted_prompt_tokens()
    for t in threads:
        t.start()
    server.wait_until_admitted(before, 4 * len(PROMPT))  # the server's pause must find them in flight
    with server.client() as client:
        assert client.post("/pause_generation", json={"mode": "abort"}).json()["status"] == "ok"
        for t in threads:
            t.join(120)
        assert [r.json()["meta_info"]["finish_reason"]["type"] for r in results] == ["abort"] * 4
        assert all(len(r.json()["output_ids"]) < server.long_tokens for r in results)

        held: list = []
        waiter = threading.Thread(
            target=lambda: held.append(
                _generate(server, {"input_ids": PROMPT, "sampling_params": _greedy(4, ignore_eos=True)})
            )
        )
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not held  # a new request waits while paused
        assert client.post("/continue_generation", json={}).json()["status"] == "ok"
    waiter.join(120)
    assert held[0].status_code == 200 and held[0].json()["meta_info"]["finish_reason"]["type"] == "length"


# ---------------------------------------------------------------------- weights


def test_update_weights_from_disk_sets_the_version_in_model_info_and_tokens(server, weights):
    version = int(server.version()) + 1
    new_model = perturbed_copy(weights["model"], seed=version)
    path = write_new_version(server, new_model, version)
    with server.client() as client:
        reply = client.post(
            "/update_weights_from_disk",
            json={"model_path": str(path), "weight_version": str(version), "flush_cache": True},
        )
        assert reply.status_code == 200 and reply.json()["success"] is True, reply.text
        assert client.get("/model_info").json()["weight_version"] == str(version)
    weights["model"] = new_model
    out = _generate(
        server, {"input_ids": PROMPT, "sampling_params": _greedy(16, ignore_eos=True), "return_logprob": True}
    ).json()
    assert out["meta_info"]["weight_version"] == str(version)
    if "weight_versions" in out["meta_info"]:
        assert out["meta_info"]["weight_versions"] == [{"version": str(version), "start": 0, "end": 16}]
    reference = teacher_forced(new_model, PROMPT, out["output_ids"])
    got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
    assert (reference - got).abs().max().item() < server.logprob_tol


def test_a_generation_spanning_an_update_shows_both_versions_and_exact_logprobs(server, weights):
    """SGLangEngine: pause (abort) → update → continue; interrupted requests are re-sent and finish."""
    engine = _engine(server)
    old_model, old_version = weights["model"], engine.get_version()
    new_version = old_version + 1
    new_model = perturbed_copy(old_model, seed=new_version)
    n_new = min(server.long_tokens, 400)
    reqs = [
        ModelRequest(
            PROMPT + [10 + i], GenerationConfig(max_new_tokens=n_new, temperature=1.0, ignore_eos=True)
        )
        for i in range(4)
    ]

    async def run():
        tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in reqs]
        await asyncio.sleep(0.3)
        await engine.aupdate_weights(new_model, version=new_version)  # written under weights_dir first
        return await asyncio.gather(*tasks)

    try:
        responses = asyncio.run(run())
        assert engine.get_version() == new_version and server.version() == str(new_version)
    finally:
        engine.close()
    weights["model"] = new_model
    spanning = 0
    for r in responses:
        assert r.stop_reason == "length" and r.output_len == n_new
        assert r.output_versions == sorted(r.output_versions) and set(r.output_versions) <= {
            old_version,
            new_version,
        }
        switch = r.output_versions.index(new_version) if new_version in r.output_versions else n_new
        spanning += 0 < switch < n_new
        got = torch.tensor(r.output_logprobs)
        old_ref = teacher_forced(old_model, r.input_tokens, r.output_tokens)
        new_ref = teacher_forced(new_model, r.input_tokens, r.output_tokens)
        assert _max_error(old_ref[:switch], got[:switch]) < server.logprob_tol
        assert _max_error(new_ref[switch:], got[switch:]) < server.logprob_tol
    assert spanning >= 1, [r.output_versions[:1] + r.output_versions[-1:] for r in responses]


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input_ids": PROMPT, "sampling_params": {"max_tokens": 4}}, "max_tokens"),
        # SGLang's decoder names the wrong value, not the field (serde's text): "invalid type:
        # floating point `4.0`, expected i64"; engine-server says the same after the field's name
        (
            {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4.0}},
            "invalid type: floating point `4.0`",
        ),
        ({"input_ids": [], "sampling_params": {"max_new_tokens": 4}}, "empty"),
    ],
    ids=["unknown-sampling-key", "float-max-new-tokens", "empty-input-ids"],
)
def test_bad_generate_requests_are_400_and_the_server_keeps_serving(server, body, fragment):
    response = _generate(server, body)
    assert response.status_code == 400
    assert fragment in error_text(response)
    ok = _generate(server, {"input_ids": PROMPT, "sampling_params": _greedy(2, ignore_eos=True)})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


def test_a_failed_weight_update_is_400_and_changes_nothing(server):
    before = server.version()
    with server.client() as client:
        reply = client.post(
            "/update_weights_from_disk",
            json={"model_path": str(server.weights_dir / "no-such-version"), "weight_version": "999"},
        )
        assert reply.status_code == 400 and reply.json()["success"] is False
        assert client.get("/model_info").json()["weight_version"] == before
    assert _generate(server, {"input_ids": PROMPT, "sampling_params": _greedy(2)}).status_code == 200


def test_client_turns_a_400_into_value_error(server):
    engine = _engine(server)
    try:
        with pytest.raises(ValueError, match="rejected"):
            asyncio.run(engine.agenerate(ModelRequest([], GenerationConfig(max_new_tokens=4))))
        ok = asyncio.run(
            engine.agenerate(ModelRequest(list(PROMPT), GenerationConfig(max_new_tokens=3, ignore_eos=True)))
        )
    finally:
        engine.close()
    assert ok.output_len == 3

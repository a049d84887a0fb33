"""GRPO steps with the trainer in this process and the engine on servers: two `areal-nb
engine-server` processes (or a real SGLang server from the device check) behind one `SGLangEngine`.

The trainer's `push_weights` hands the engine its state dict; the engine writes it under the shared
weights directory (atomic rename) and every server loads it from disk with version + 1. The
log-probs the servers record must equal the trainer's own recomputation after every update."""

from __future__ import annotations

import pytest
import torch
from servers import API_KEY, load_reference, sglang_under_test, start_engine_server

from areal_nb.api import GenerationConfig
from areal_nb.api.train_batch import TrainBatch
from areal_nb.engine.remote import SGLangEngine
from areal_nb.testing import sample_batch
from areal_nb.train import Actor, GRPOConfig

pytestmark = pytest.mark.slow

PROMPTS = [[5, 17, 42, 99, 7, 31], [8, 9, 10, 11]]
TEMPERATURE = 0.8


@pytest.fixture(params=["engine-server", "sglang"])
def remote(request, tmp_path):
    """(SGLangEngine, model path, log-prob tolerance)."""
    if request.param == "sglang":
        found = sglang_under_test()
        if found is None:
            pytest.skip("set AREAL_NB_SGLANG_URL (benchmarks/gpu_check.sh does) to run against real SGLang")
        engine = SGLangEngine(
            [found.url], api_key=found.api_key, weights_dir=found.weights_dir, config_source=found.model_path
        )
        yield engine, found.model_path, found.logprob_tol
        engine.close()
        return
    from areal_nb.models import resolve_model_path

    shared = tmp_path / "shared-weights"
    procs = [start_engine_server(tmp_path / n, name=n, weights_dir=shared) for n in ("a", "b")]
    model_path = str(resolve_model_path("tiny-math"))
    engine = SGLangEngine(
        [p.url for p in procs],
        api_key=API_KEY,
        weights_dir=shared,
        config_source=model_path,
        owned_processes=procs,
    )
    yield engine, model_path, 1e-4
    engine.close()  # stops the servers it owns


def rollout(engine, n_samples: int = 4):
    gconfig = GenerationConfig(max_new_tokens=8, temperature=TEMPERATURE, ignore_eos=True)
    # a reward that varies between samples (within the default reward clip)
    return sample_batch(engine, PROMPTS, gconfig, lambda r: (sum(r.output_tokens) % 5) / 4, n_samples)


def test_grpo_steps_through_remote_engines_keep_logprobs_exact(remote):
    engine, model_path, tol = remote
    actor = Actor(
        load_reference(model_path), GRPOConfig(lr=1e-2), version=engine.get_version(), temperature=TEMPERATURE
    )
    start = engine.get_version()
    # earlier tests may have left other weights on the servers: start from the trainer's own
    actor.push_weights(engine, start)
    for step in range(1, 4):
        batch, groups = rollout(engine)
        generated = batch["versions"][batch["loss_mask"].bool()]
        assert (generated == start + step - 1).all()
        head = actor.model.lm_head.weight.detach().clone()
        stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
        assert stats["logprob_abs_diff_max"] < tol, step  # servers sampled with the trainer's weights
        assert not torch.equal(head, actor.model.lm_head.weight), stats
        assert actor.push_weights(engine) == start + step
        assert engine.get_version() == start + step
        assert {info["weight_version"] for info in engine.model_info()} == {str(start + step)}

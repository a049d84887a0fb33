"""An embedded engine serving the trainer's parameters themselves (`LocalEngine(share_weights=True)`,
`Actor.serve_in_place`): no copy of the weights, none per push. Generations run concurrently
with train steps; every token must carry the version of the weights that sampled it, and its
recorded log-prob must equal a replay of its decoding with that version's weights (the keys and
values of each position computed by the version that fed it, as the engine keeps a row's cache
across updates)."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from transformers import DynamicCache

from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.engine import LocalEngine
from areal_nb.train import Actor, GRPOConfig, TrainBatch

from ..train.conftest import make_tiny_qwen2
from ..train.test_engine_roundtrip import rollout

pytestmark = pytest.mark.slow


def test_the_engine_serves_the_trainers_tensors_and_copies_nothing_on_a_push():
    model = make_tiny_qwen2()
    with LocalEngine(model, device="cpu", share_weights=True) as engine:
        assert engine.shares_weights
        ours, theirs = dict(engine.model.named_parameters()), dict(model.named_parameters())
        assert ours.keys() == theirs.keys() and all(ours[k] is theirs[k] for k in ours)
        assert engine.model is not model and engine.model.config is not model.config  # own modules
        assert all(p.requires_grad for p in model.parameters())  # the trainer's flags are untouched
        before = {k: v.data_ptr() for k, v in engine.model.state_dict().items()}
        engine.update_weights(model.state_dict(), version=3)  # a push: a version change, no copy
        assert engine.get_version() == 3
        assert {k: v.data_ptr() for k, v in engine.model.state_dict().items()} == before
        # a foreign state dict is still copied in (a checkpoint's weights): into the shared tensors
        other = {k: v + 1 for k, v in model.state_dict().items()}
        engine.update_weights(other, version=4)
        assert torch.equal(model.lm_head.weight, other["lm_head.weight"])


@pytest.mark.parametrize(
    ("device_dtype", "model_dtype"),
    [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
    ids=["engine-bf16", "model-bf16"],
)
def test_another_dtype_keeps_a_copy(device_dtype, model_dtype):
    model = make_tiny_qwen2().to(model_dtype)
    with LocalEngine(model, device="cpu", dtype=device_dtype, share_weights=True) as engine:
        assert not engine.shares_weights
        assert all(
            p.data_ptr() != q.data_ptr()
            for p, q in zip(engine.model.parameters(), model.parameters(), strict=True)
        )
    with LocalEngine(make_tiny_qwen2(), device="cpu") as engine:
        assert not engine.shares_weights  # sharing is asked for, never assumed


def replayed_logprobs(model, snapshots, prompt, output, versions, temperature):
    """Each output token's log-prob when decoding is replayed, the step that sampled token t (and
    fed its predecessor) running the weights of version `versions[t]`: one teacher-forced forward
    per run of tokens of one version, on the cache the earlier versions filled."""
    replay = copy.deepcopy(model)
    cache = DynamicCache()
    out: list[float] = []
    start = 0
    with torch.no_grad():
        while start < len(output):
            end = start
            while end < len(output) and versions[end] == versions[start]:
                end += 1
            replay.load_state_dict(snapshots[versions[start]])
            fed = (list(prompt) if start == 0 else [output[start - 1]]) + list(output[start : end - 1])
            logits = replay(input_ids=torch.tensor([fed]), past_key_values=cache, use_cache=True).logits[0]
            scores = torch.log_softmax(logits[-(end - start) :].float() / temperature, -1)
            out += scores[torch.arange(end - start), torch.tensor(output[start:end])].tolist()
            start = end
    return out


def train_while_generating(engine, actor, policy, replay_model, temperature):
    """Three threads generate while the actor takes 4 train steps and pushes each; every
    token's version is the one that sampled it, and its log-prob is the replay's with that
    version's weights (`policy()`: the weights under the plain model's names, run by
    `replay_model`)."""
    snapshots = {0: {k: v.detach().clone() for k, v in policy().items()}}
    batch, group_ids = rollout(engine, temperature=temperature)
    responses, stop = [], threading.Event()

    def generate_until_stopped(seed: int) -> None:
        prompt = [5 + seed, 17, 42, 30 - seed]
        while not stop.is_set():
            config = GenerationConfig(max_new_tokens=40, temperature=temperature, ignore_eos=True)
            responses.append(engine.generate(ModelRequest(prompt, config)))

    threads = [threading.Thread(target=generate_until_stopped, args=(i,)) for i in range(3)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(4):
            time.sleep(0.05)
            actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(group_ids)))
            snapshots[actor.version] = {k: v.detach().clone() for k, v in policy().items()}
            time.sleep(0.05)  # what the Session does between the step and the push (stats, history)
            assert actor.push_weights(engine) == actor.version == engine.get_version()
        time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        engine.close()
    assert actor.version == 4 and not engine.paused
    spanning = [r for r in responses if len(set(r.output_versions)) > 1]
    assert spanning, "no generation ran across a train step"
    assert {v for r in responses for v in r.output_versions} == set(range(5))
    worst = 0.0
    for response in spanning[:8] + [r for r in responses if r not in spanning][:8]:
        assert response.output_versions == sorted(response.output_versions)
        expected = replayed_logprobs(
            replay_model,
            snapshots,
            response.input_tokens,
            response.output_tokens,
            response.output_versions,
            temperature,
        )
        worst = max(worst, max(abs(a - b) for a, b in zip(expected, response.output_logprobs, strict=True)))
    assert worst < 1e-4, worst
    # the same replay with each token's version one lower fails: the check tells versions apart
    shifted = spanning[0]
    wrong = [max(v - 1, 0) if v == max(shifted.output_versions) else v for v in shifted.output_versions]
    off = replayed_logprobs(
        replay_model, snapshots, shifted.input_tokens, shifted.output_tokens, wrong, temperature
    )
    assert max(abs(a - b) for a, b in zip(off, shifted.output_logprobs, strict=True)) > 1e-3


def test_concurrent_generations_across_steps_carry_the_version_that_sampled_each_token():
    model = make_tiny_qwen2()
    temperature = 0.8
    engine = LocalEngine(model, device="cpu", seed=0, share_weights=True)
    actor = Actor(model, GRPOConfig(lr=3e-2), version=0, temperature=temperature)
    actor.serve_in_place(engine)
    train_while_generating(engine, actor, model.state_dict, model, temperature)

"""The loop on a real model: SmolLM2-135M-Instruct, `model.path` its GGUF file as shipped.

A Session samples through the proxy, records log-probs, trains GRPO steps and pushes weights; the
trainer's recomputed log-probs equal the recorded ones (float32, 1e-4) before and after a push;
the exported `save_pretrained` folder is a plain Hugging Face model that decodes greedily through
the proxy exactly as `transformers.generate` does; LoRA trains only the adapter and the engine
serves base + adapter.

Small on purpose (2 prompts x 2 samples, 16 new tokens): the point is a real architecture,
vocabulary and template, not learning.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_nb import Session
from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, session_headers, start_session

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": "Name a colour of the sky."},
    {"prompt": "What is 2 + 3?"},
    {"prompt": "Say hello in French."},
    {"prompt": "Name a fruit."},
]
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Count to five."}],
]
NEW_TOKENS = 12


def reply_length(row, reply: str) -> float:
    """Any reward that differs between two samples gives the group an advantage to learn from."""
    return len(reply) / 100


REWARD = f"{__name__}.reply_length"


def session_on(gguf, **overrides) -> Session:
    settings = dict(
        model__path=str(gguf),
        model__dtype="float32",
        rollout__batch_size=2,
        rollout__group_size=2,
        rollout__max_new_tokens=16,
        rollout__prefetch=False,
        logging__progress=False,
        actor__lr=1e-5,
    )
    settings.update(overrides)
    return Session(
        dataset=ROWS,
        # by import path, so a checkpoint can name it
        agent__workflow="areal_nb.agents.chat_agent.ChatAgent",
        agent__workflow_kwargs={"reward_fn": REWARD},
        **settings,
    )


def proxy_greedy(folder, messages_list) -> list[list[int]]:
    """Greedy replies through the proxy (the real OpenAI SDK, temperature 0) on the embedded engine
    loaded from `folder`, as the proxy recorded them."""
    from areal_nb.engine import LocalEngine
    from areal_nb.models import load_tokenizer
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app

    tokenizer = load_tokenizer(str(folder))
    engine = LocalEngine(str(folder), tokenizer, device="cpu", seed=0)
    try:
        app = create_app(engine, tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
        with ProxyServer(app) as running, httpx.Client(base_url=running.url) as http:
            sid, key = start_session(http, "greedy")
            client = openai.OpenAI(base_url=running.url + "/v1", api_key=key, max_retries=0)
            for messages in messages_list:
                client.chat.completions.create(
                    model="m", messages=messages, temperature=0, max_tokens=NEW_TOKENS
                )
            assert http.post("/rl/end_session", headers=session_headers(key)).status_code == 200
            exported = http.post(
                "/export_trajectories", headers=admin_headers(), json={"session_id": sid}
            ).json()
    finally:
        engine.close()
    return [
        (it["model_response"]["input_tokens"], it["model_response"]["output_tokens"])
        for it in exported["interactions"].values()
    ]


def test_grpo_steps_record_the_trainers_logprobs_and_export_a_plain_folder(smollm2, tmp_path):
    gguf, converted = smollm2
    with session_on(gguf) as session:
        assert type(session.actor.model).__name__ == "LlamaForCausalLM"
        assert session.tokenizer.chat_template == AutoTokenizer.from_pretrained(converted).chat_template
        before = {k: v.detach().clone() for k, v in session.actor.weights().items()}
        for step in range(2):  # the second rollout is sampled by the weights the first step pushed
            stats = session.train_step(session.rollout())
            assert stats["logprob_abs_diff_max"] < 1e-4, (step, stats["logprob_abs_diff_max"])
        assert session.version == 2
        after = session.actor.weights()
        assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
        folder = session.save_pretrained(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]

    served = proxy_greedy(folder, PROMPTS)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # plain transformers, no areal_nb
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for messages, (prompt, output) in zip(PROMPTS, served, strict=True):
        assert prompt == tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        generated = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS)
        expected = generated[0, len(prompt) :].tolist()
        assert output == expected[: len(output)] and len(output) in (len(expected), NEW_TOKENS)
        assert len(output) > 1


def test_lora_trains_only_the_adapter_and_the_engine_serves_base_plus_adapter(smollm2, tmp_path):
    from safetensors.torch import load_file

    from areal_nb.cli import main as cli_main
    from areal_nb.train.lora import merged_weights

    gguf, _ = smollm2
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    with session_on(gguf, actor__lora=lora, actor__lr=1e-2) as session:
        named = dict(session.actor.model.named_parameters())
        before = {k: p.detach().clone() for k, p in named.items()}
        served_before = {k: v.clone() for k, v in session.engine.model.state_dict().items()}
        stats = session.train_step(session.rollout())
        assert stats["logprob_abs_diff_max"] < 1e-4
        changed = sorted(k for k, p in named.items() if not torch.equal(before[k], p.detach()))
        assert changed and all("lora_" in k for k in changed)  # the base is frozen
        assert any("lora_B" in k for k in changed)  # the adapter's delta is no longer zero
        # the engine serves base + adapter in place (one float32 copy, same device): its weights
        # are the trainer's frozen base, unchanged by the step, and the adapter is the trainer's
        # own tensors, so the push copied nothing; the log-probs it records are base + adapter's
        # (logprob_abs_diff_max above and after the next rollout below)
        assert session.engine.shares_weights
        served = session.engine.model.state_dict()
        assert sorted(served) == sorted(served_before)
        assert all(torch.equal(served[k], served_before[k]) for k in served)
        assert sorted(merged_weights(session.actor.model)) == sorted(served)
        # and the next rollout, sampled by it, records the trainer's base + adapter log-probs
        stats = session.train_step(session.rollout())
        assert stats["logprob_abs_diff_max"] < 1e-4
        merged = {k: v.clone() for k, v in merged_weights(session.actor.model).items()}
        checkpoint = session.save(tmp_path / "ckpt")
    # the checkpoint names its base by the GGUF file; export-model merges it into a plain folder
    base = json.loads((checkpoint / "base_model.json").read_text())
    assert base["path"] == str(gguf.resolve())
    assert cli_main(["export-model", str(checkpoint), str(tmp_path / "hf")]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(merged) - set(exported) == {"lm_head.weight"}  # tied to the embeddings, saved once
    assert all(torch.equal(exported[k], merged[k]) for k in exported)

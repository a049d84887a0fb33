"""Trained policies out as Hugging Face folders: `Session.save_pretrained` and
`areal-nb export-model`, loaded back by plain `transformers` and decoded greedily."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal_nb import Session
from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.cli import main as cli_main
from areal_nb.config import load_config

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = {
    "rollout__batch_size": 2,
    "rollout__group_size": 2,
    "logging__progress": False,
    "rollout__prefetch": False,
}
PROMPTS = ["What is 3 + 4?", "Compute 12 * 2.", "Is 7 prime?"]
NEW_TOKENS = 12


def config(**kw):
    overrides = {**SMALL, **kw}
    return load_config(CONFIG, [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])


def engine_greedy(session: Session, prompt_ids: list[int]) -> list[int]:
    request = ModelRequest(
        input_ids=prompt_ids, gconfig=GenerationConfig(greedy=True, max_new_tokens=NEW_TOKENS)
    )
    return session._lead.runtime.call(session.engine.agenerate(request)).output_tokens


def transformers_greedy(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto").eval()
    out = []
    for ids in prompts:
        generated = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)
        out.append(generated[0, len(ids) :].tolist())
    return out


def chat_prompts(folder: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in PROMPTS
    ]


def same_until_engine_stopped(engine_tokens: list[int], hf_tokens: list[int]) -> None:
    # the engine strips nothing from output_tokens; it may stop at EOS, where generate stops too
    assert hf_tokens[: len(engine_tokens)] == engine_tokens
    assert len(engine_tokens) == len(hf_tokens) or len(engine_tokens) == NEW_TOKENS


def test_save_pretrained_after_a_step_decodes_like_the_engine(tmp_path):
    with Session(config()) as session:
        session.train_step(session.rollout())  # the exported weights are trained ones, not model.path's
        folder = session.save_pretrained(tmp_path / "hf")
        prompts = chat_prompts(folder)
        engine_tokens = [engine_greedy(session, ids) for ids in prompts]
        assert all(engine_tokens)
        trained = {k: v.detach().clone() for k, v in session.actor.weights().items()}
        template = session.tokenizer.chat_template
    assert (folder / "model.safetensors").exists() and (folder / "generation_config.json").exists()
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"
    assert AutoTokenizer.from_pretrained(folder).chat_template == template and template
    with safe_open(folder / "model.safetensors", "pt") as saved:
        for name in saved.keys():  # noqa: SIM118 - safe_open has no __iter__
            assert torch.equal(saved.get_tensor(name), trained[name]), name
    for engine, hf in zip(engine_tokens, transformers_greedy(folder, prompts), strict=True):
        same_until_engine_stopped(engine, hf)


def test_export_model_cli_writes_a_checkpoints_policy(tmp_path, capsys):
    with Session(config(model__dtype="bfloat16")) as session:
        session.train_step(session.rollout())
        checkpoint = session.save(tmp_path / "ckpt")
        trained = {k: v.detach().to(torch.bfloat16) for k, v in session.actor.weights().items()}
    assert cli_main(["export-model", str(checkpoint), str(tmp_path / "hf")]) == 0
    assert "wrote" in capsys.readouterr().out
    folder = tmp_path / "hf"
    # the float32 master weights, saved in the run's configured dtype
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(folder / "model.safetensors", "pt") as saved:
        names = list(saved.keys())
        assert names and all(torch.equal(saved.get_tensor(n), trained[n]) for n in names)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert model.dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(folder).chat_template


def test_export_model_cli_rejects_a_folder_that_is_no_checkpoint(tmp_path, capsys):
    assert cli_main(["export-model", str(tmp_path), str(tmp_path / "hf")]) == 2
    assert "is not a Session checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_save_pretrained_merged_false_needs_lora(tmp_path):
    with Session(config()) as session, pytest.raises(ValueError, match="merged=True"):
        session.save_pretrained(tmp_path / "adapter", merged=False)


LORA = "{r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"


def test_lora_session_exports_merged_and_adapter_folders_that_decode_like_the_engine(tmp_path):
    from peft import PeftModel

    from areal_nb.models import load_model

    with Session(config(actor__lora=LORA, actor__lr=5e-2, actor__kl_ctl=0.05)) as session:
        assert session.actor.ref_model is None  # the reference is the base with the adapters off
        for _ in range(2):
            stats = session.train_step(session.rollout())
            assert stats["logprob_abs_diff_max"] < 1e-4  # the engine's record vs base + adapter
        merged = session.save_pretrained(tmp_path / "merged")
        adapter = session.save_pretrained(tmp_path / "adapter", merged=False)
        prompts = chat_prompts(merged)
        engine_tokens = [engine_greedy(session, ids) for ids in prompts]
        assert all(engine_tokens)
        base_path = session.config.model.path
    assert not (adapter / "model.safetensors").exists() and (adapter / "adapter_model.safetensors").exists()
    for engine, hf in zip(engine_tokens, transformers_greedy(merged, prompts), strict=True):
        same_until_engine_stopped(engine, hf)
    peft_model = PeftModel.from_pretrained(load_model(base_path, dtype=torch.float32), adapter).eval()
    for ids, engine in zip(prompts, engine_tokens, strict=True):
        generated = peft_model.generate(
            input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS
        )
        same_until_engine_stopped(engine, generated[0, len(ids) :].tolist())


def test_lora_checkpoint_resumes_and_exports_the_adapted_policy(tmp_path):
    with Session(config(actor__lora=LORA, actor__lr=5e-2)) as session:
        session.train_step(session.rollout())
        checkpoint = session.save(tmp_path / "ckpt")
        session.save_pretrained(tmp_path / "merged")
    assert cli_main(["export-model", str(checkpoint), str(tmp_path / "from_ckpt")]) == 0
    with (
        safe_open(tmp_path / "merged" / "model.safetensors", "pt") as a,
        safe_open(tmp_path / "from_ckpt" / "model.safetensors", "pt") as b,
    ):
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())  # noqa: SIM118
    with Session.load(checkpoint) as resumed:
        assert resumed.actor.lora and resumed.version == 1
        from areal_nb.train.lora import merged_weights

        restored = merged_weights(resumed.actor.model)  # the trained adapters came back, not fresh ones
        with safe_open(tmp_path / "merged" / "model.safetensors", "pt") as saved:
            assert all(torch.equal(saved.get_tensor(k), restored[k]) for k in saved.keys())  # noqa: SIM118
        stats = resumed.train_step(resumed.rollout())
        assert stats["logprob_abs_diff_max"] < 1e-4  # the engine serves the restored base + adapter


@pytest.mark.parametrize("lora", [LORA, "null"], ids=["lora", "full"])
def test_export_model_takes_a_run_folders_latest_checkpoint(tmp_path, capsys, lora):
    """`areal-nb export-model RUN DIR` picks the run's last checkpoint; the merged folder (and a
    LoRA run's adapter on its base, with peft) greedy-decodes what the engine decodes."""
    from peft import PeftModel

    from areal_nb.models import load_model

    run = tmp_path / "run"
    overrides = dict(actor__lora=lora, actor__lr=5e-2, checkpoint__save_dir=str(run / "checkpoints"))
    with Session(config(**overrides, checkpoint__save_every=1)) as session:
        session.run(2)
        prompts = chat_prompts(session.save_pretrained(tmp_path / "live"))
        engine_tokens = [engine_greedy(session, ids) for ids in prompts]  # the policy of step 2
        base_path = session.config.model.path
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step1", "step2"]
    assert all(engine_tokens)

    assert cli_main(["export-model", str(run), str(tmp_path / "merged")]) == 0
    assert f"from {run / 'checkpoints' / 'step2'}" in capsys.readouterr().out
    for engine, hf in zip(engine_tokens, transformers_greedy(tmp_path / "merged", prompts), strict=True):
        same_until_engine_stopped(engine, hf)

    adapter = tmp_path / "adapter"
    if lora == "null":
        assert cli_main(["export-model", str(run), str(adapter), "--adapter"]) == 2
        assert "no LoRA adapter" in capsys.readouterr().err and not adapter.exists()
        return
    assert cli_main(["export-model", str(run), str(adapter), "--adapter"]) == 0
    assert (adapter / "adapter_model.safetensors").exists() and not (adapter / "model.safetensors").exists()
    peft_model = PeftModel.from_pretrained(load_model(base_path, dtype=torch.float32), adapter).eval()
    for ids, engine in zip(prompts, engine_tokens, strict=True):
        generated = peft_model.generate(
            input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS
        )
        same_until_engine_stopped(engine, generated[0, len(ids) :].tolist())

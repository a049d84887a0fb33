"""The trainer on Llama, Qwen3, Mistral, Gemma 3 and Gemma 2 (random init, 2 layers), in float32 and
bfloat16: the fast paths where they are exact, an explicit fallback where they are not, and a
Session that records log-probs equal to the trainer's recomputation."""

import json
import shutil

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig, compute_token_logprobs
from areal_nb.train.head_forward import supports_head_forward
from areal_nb.train.lm_head import split_head
from areal_nb.train.packing import pack_rows, packed_token_logprobs_and_entropy
from areal_nb.train.tree_attention import supports_tree_attention

from .families import FAMILIES, make_family_model

VOCAB = 48
WINDOW = 4  # shorter than the rows below, so the sliding window changes the values
PROMPT = [2, 3, 4, 5, 6, 7]
COMPLETIONS = [[10, 11, 12, 13, 14, 1], [10, 11, 20, 21, 1], [30, 31, 32, 33, 34, 35, 36, 1], [40, 1]]

# which fast path each family takes: (tree attention, last layer at the heads only, split LM head)
PATHS = {
    "llama": (True, True, True),
    "qwen3": (True, False, True),  # query/key norms: the last layer runs whole
    "mistral": (False, False, True),  # sliding window on every layer: the dense tree mask
    "gemma3": (False, False, True),  # sliding layers: the dense tree mask; soft-capped logits in the head
    "gemma2": (False, False, True),  # the same, and soft-capped attention scores (eager attention)
}


def rows():
    data = [PROMPT + c for c in COMPLETIONS]
    width = max(map(len, data))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in data])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in data], dtype=torch.bool)
    mask = torch.tensor(
        [
            [0] * len(PROMPT) + [1] * len(c) + [0] * (width - len(r))
            for c, r in zip(COMPLETIONS, data, strict=True)
        ],
        dtype=torch.bool,
    )
    return ids, attention, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_takes_its_fast_paths_or_an_explicit_fallback(family):
    model = make_family_model(family, VOCAB, window=WINDOW)
    tree, heads, split = PATHS[family]
    assert supports_tree_attention(model) == tree
    assert supports_head_forward(model) == heads
    assert (split_head(model) is not None) == split


@pytest.mark.parametrize("chunk", [0, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logprobs_equal_the_stock_forward_with_the_real_attention(family, chunk):
    """The trainer's packed paths against the model's own padded forward, which applies the
    sliding window and the soft-capping itself (Gemma 2's of attention scores too)."""
    model = make_family_model(family, VOCAB, window=WINDOW)
    ids, attention, mask = rows()
    with torch.no_grad():
        reference = compute_token_logprobs(model, ids, attention)
        for flat in {False, supports_tree_attention(model)}:
            for heads in (False, True):
                packed = pack_rows(ids, attention, [0, 0, 1, 1], flat=flat)
                logprobs, _ = packed_token_logprobs_and_entropy(
                    model, packed, positions=mask, last_layer_at_heads=heads, chunk=chunk
                )
                assert torch.allclose(logprobs[mask], reference[mask], atol=1e-5), (flat, heads)


def test_the_window_matters_in_that_check():
    """(Without it the check above could not fail for the sliding-window families.)"""
    narrow = make_family_model("mistral", VOCAB, window=WINDOW)
    wide = make_family_model("mistral", VOCAB, window=4096)
    ids, attention, mask = rows()
    with torch.no_grad():
        assert not torch.allclose(
            compute_token_logprobs(narrow, ids, attention)[mask],
            compute_token_logprobs(wide, ids, attention)[mask],
            atol=1e-3,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_actor_trains_each_family(family, dtype):
    model = make_family_model(family, VOCAB, window=WINDOW).to(dtype)
    ids, attention, mask = rows()
    with torch.no_grad():
        engine = make_family_model(family, VOCAB, window=WINDOW).to(
            dtype
        )  # the engine serves the compute dtype
        logprobs = compute_token_logprobs(engine, ids, attention) * mask
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": mask.long(),
        "logprobs": logprobs,
        "rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]),
    }
    actor = Actor(model, GRPOConfig(lr=1e-3, logprob_chunk_size=3, gradient_checkpointing=True))
    before = {k: v.clone() for k, v in actor.weights().items()}
    stats = [actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor([0, 0, 1, 1]))) for _ in range(2)]
    bound = 1e-5 if dtype == torch.float32 else BF16_BOUND
    assert stats[0]["logprob_abs_diff_max"] < bound, stats[0]["logprob_abs_diff_max"]
    assert stats[0]["importance_weight_max"] == pytest.approx(1.0, abs=1e-5)  # π_θ = π_prox before the update
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in stats)
    assert any(not torch.equal(v, before[k]) for k, v in actor.weights().items())


# bfloat16: the engine runs the model in bf16 end to end; the trainer computes matmuls in bf16
# but keeps float32 weights, residual stream and norms (autocast): the log-probs differ by bf16
# rounding of a random model's flat distributions.
BF16_BOUND = 0.1


def family_folder(family: str, folder) -> str:
    """A random-init `family` model with the tiny-math tokenizer (its vocabulary and special
    tokens, its chat template), saved as a model folder a Session can load. Its sliding window
    (Mistral, Gemma) is shorter than every prompt, and Gemma 2 soft-caps its attention scores:
    the engine must apply both as the trainer's forward does."""
    from areal_nb.models import resolve_model_path

    source = resolve_model_path("tiny-math")
    with open(f"{source}/config.json") as f:
        tiny = json.load(f)
    ids = {k: tiny[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    model = make_family_model(family, tiny["vocab_size"], window=8, **ids)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(f"{source}/{name}", folder / name)
    return str(folder)


# bfloat16 in a Session: recorded (engine, bf16 end to end) vs recomputed (autocast over float32
# master weights) log-probs of a random model, measured < 0.05 here; the bound leaves room.
SESSION_BF16_BOUND = 0.1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_session_trains_each_family_and_records_the_trainers_logprobs(family, dtype, tmp_path):
    from areal_nb import Session

    from ..test_session import config

    path = family_folder(family, tmp_path / family)
    cfg = config(
        model__path=path, model__dtype=dtype, rollout__max_new_tokens=8, actor__logprob_chunk_size=16
    )
    with Session(cfg) as session:
        for _ in range(2):
            stats = session.train_step(session.rollout())
            bound = 1e-4 if dtype == "float32" else SESSION_BF16_BOUND
            assert stats["logprob_abs_diff_max"] < bound, (family, dtype, stats["logprob_abs_diff_max"])
        assert session.version == 2
        assert all(p.dtype == torch.float32 for p in session.actor.params)
        assert session.engine.model.dtype == getattr(torch, dtype)

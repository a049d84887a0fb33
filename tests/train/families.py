"""Small random-init configs of the causal-LM families the trainer is tested on, each with its
own attention variant: grouped-query attention everywhere, query/key norms (Qwen3), a sliding
window on every layer (Mistral), sliding and full layers with soft-capped logits (Gemma 3), and
soft-capped attention scores as well (Gemma 2, whose transformers forward has no sdpa path).

(Gemma 3's config has an `attn_logit_softcapping` field too, but transformers' Gemma 3 attention
does not apply it; Gemma 2's does.)"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen3Config,
)

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def family_config(family: str, vocab_size: int, window: int = 4096, **ids: int | None):
    """The config of `family` (one of `FAMILIES`); `window` is the sliding window of Mistral's
    layers and of Gemma's sliding layers."""
    if family == "llama":
        return LlamaConfig(vocab_size=vocab_size, **COMMON, **ids)
    if family == "qwen3":
        return Qwen3Config(vocab_size=vocab_size, head_dim=16, **COMMON, **ids)
    if family == "mistral":
        return MistralConfig(vocab_size=vocab_size, sliding_window=window, **COMMON, **ids)
    # Gemma: sliding and full layers, soft-capped logits
    gemma = {
        "vocab_size": vocab_size,
        "head_dim": 16,
        "sliding_window": window,
        "layer_types": ["sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        **COMMON,
        **ids,
    }
    if family == "gemma3":
        return Gemma3TextConfig(**gemma)
    if family == "gemma2":
        # soft-capped attention scores too; weights 10x the usual init scale make those scores a
        # few units, so the cap at 1 changes the log-probs by ~1: a path that dropped the
        # soft-capping would be caught
        return Gemma2Config(**gemma, attn_logit_softcapping=1.0, initializer_range=0.2)
    raise ValueError(family)


FAMILIES = ("llama", "qwen3", "mistral", "gemma3", "gemma2")


def make_family_model(family: str, vocab_size: int, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = family_config(family, vocab_size, **kw)
    if getattr(config, "attn_logit_softcapping", None):
        config._attn_implementation = "eager"  # (sdpa has no soft-capping)
    return AutoModelForCausalLM.from_config(config).eval()

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 48


def make_tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """A random two-layer Qwen2 (the tiny-math architecture, smaller): builds in milliseconds."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def tiny_qwen2():
    return make_tiny_qwen2()

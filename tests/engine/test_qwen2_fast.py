"""The decoding step's own attention equals torch's sdpa, with and without grouped KV heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from areal_nb.engine.qwen2_fast import _single_query_attention


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_single_query_attention_equals_sdpa(n_kv):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 8, generator=gen)
    k = torch.randn(3, n_kv, 5, 8, generator=gen)
    v = torch.randn(3, n_kv, 5, 8, generator=gen)
    pads = torch.tensor([0, 2, 4])  # left padding per row, as in kv_batch
    padding = (torch.arange(5)[None] < pads[:, None])[:, None, None, :]
    mask = torch.zeros(padding.shape).masked_fill_(padding, float("-inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=~padding, scale=0.3, enable_gqa=n_kv != 4)
    assert torch.allclose(_single_query_attention(q, k, v, mask, 0.3), expected, atol=1e-6)

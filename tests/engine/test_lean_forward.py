"""The lean forward's pieces equal what they replace: the decoding step's attention (torch's sdpa,
with and without grouped KV heads), the rotary rotation, the prepacked projections."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from areal_nb.engine.lean_forward import _single_query_attention


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_single_query_attention_equals_sdpa(n_kv):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 8, generator=gen)
    k = torch.randn(3, n_kv, 5, 8, generator=gen)
    v = torch.randn(3, n_kv, 5, 8, generator=gen)
    pads = torch.tensor([0, 2, 4])  # left padding per row, as in kv_batch
    padding = (torch.arange(5)[None] < pads[:, None])[:, None, None, :]  # [3, 1, 1, 5]
    mask = torch.zeros(padding.shape).masked_fill_(padding, float("-inf"))
    mask = mask.expand(3, n_kv, 1, 5).reshape(3 * n_kv, 1, 5)  # the decoding step's layout
    expected = F.scaled_dot_product_attention(
        q[:, :, None], k, v, attn_mask=~padding, scale=1.0, enable_gqa=n_kv != 4
    )
    assert torch.allclose(_single_query_attention(q, k, v, mask), expected.reshape(3, 4 * 8), atol=1e-6)


def test_swapped_halves_times_signed_sin_is_rotate_half_times_sin_bit_for_bit():
    from transformers.models.qwen2.modeling_qwen2 import rotate_half

    from areal_nb.engine.lean_forward import _signed_sin, _swap_halves

    gen = torch.Generator().manual_seed(0)
    x, sin = torch.randn(2, 3, 4, 8, generator=gen), torch.randn(2, 1, 4, 8, generator=gen)
    assert torch.equal(_swap_halves(x) * _signed_sin(sin), rotate_half(x) * sin)


@pytest.mark.parametrize("bias", [True, False])
def test_prepacked_linear_equals_f_linear_to_fp32_rounding(bias):
    from areal_nb.engine.lean_forward import _Linear

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 1, 32, generator=gen), torch.randn(48, 32, generator=gen)
    b = torch.randn(48, generator=gen) if bias else None
    got = _Linear(w, b)(x)
    assert got.shape == (5, 1, 48)
    assert torch.allclose(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)

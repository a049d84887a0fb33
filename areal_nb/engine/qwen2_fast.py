"""A lean forward pass for Qwen2-architecture models (tiny-math, Qwen2.5) used by the engine.

The same arithmetic as transformers' `Qwen2ForCausalLM` (RMSNorm in fp32, rotary embeddings from
the model's own `rotary_emb`, sdpa attention, SiLU-gated MLP), read straight from the model's
parameters, without the per-module Python machinery. On small models a decode step is dominated
by that fixed overhead, not by arithmetic; removing it is what lets continuous batching profit
from rows leaving the batch. Weight updates stay visible because the parameters are read at each
call. Models of any other shape go through the stock forward (`supports` says which).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.cache_utils import Cache


def _rms_norm(hidden: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    dtype = hidden.dtype
    if dtype == torch.float32:  # one fused kernel, bitwise the same as the three-step form below
        return F.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)
    x = hidden.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _single_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of one query per row (a decoding step): q [B, Hq, 1, D], k/v [B, Hkv, L, D].

    Two batched matmuls and a softmax. torch's CPU flash-attention kernel (what sdpa picks) is
    built for long queries and took about twice as long per decoding step at 128 rows. Query
    heads that share a key/value head (GQA) are laid out as that head's rows, so k/v are never
    repeated. `mask` is additive ([B, 1, 1, L], -inf on padding).
    """
    batch, n_q, _, dim = q.shape
    n_kv = k.shape[1]
    q = q.reshape(batch, n_kv, n_q // n_kv, dim)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(mask)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(probs, v).reshape(batch, n_q, 1, dim)


class Qwen2FastForward:
    @staticmethod
    def supports(model: PreTrainedModel) -> bool:
        cfg = model.config
        inner = getattr(model, "model", None)
        return (
            type(model).__name__ == "Qwen2ForCausalLM"
            and inner is not None
            and not getattr(inner, "has_sliding_layers", True)
            and cfg.hidden_act == "silu"
        )

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.inner = model.model
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.gqa = cfg.num_key_value_heads != cfg.num_attention_heads
        self._fused: list[tuple] | None = None

    def refresh(self) -> None:
        """Forget the fused projection weights; call after the model's weights changed."""
        self._fused = None

    def _fused_weights(self) -> list[tuple]:
        # One matmul for q|k|v and one for gate|up instead of five: on a small model each
        # decoding step is dominated by per-operation overhead, not arithmetic.
        if self._fused is None:
            fused = []
            for layer in self.inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                projections = (attn.q_proj, attn.k_proj, attn.v_proj)
                w_qkv = torch.cat([p.weight for p in projections])
                if any(p.bias is not None for p in projections):
                    b_qkv = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])
                                       for p in projections])
                else:
                    b_qkv = None
                splits = [p.weight.shape[0] for p in projections]
                gate_up = (mlp.gate_proj, mlp.up_proj)
                w_gu = torch.cat([p.weight for p in gate_up])
                b_gu = None if all(p.bias is None for p in gate_up) else torch.cat(
                    [p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in gate_up])
                fused.append((w_qkv, b_qkv, splits, w_gu, b_gu))
            self._fused = fused
        return self._fused

    def __call__(
        self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache: Cache
    ) -> torch.Tensor:
        """Next-token logits [B, V] after the last position of `input_ids` [B, T]."""
        inner = self.inner
        hidden = F.embedding(input_ids, inner.embed_tokens.weight)
        cos, sin = inner.rotary_emb(hidden, position_ids)
        cos, sin = cos[:, None], sin[:, None]
        batch, length, _ = hidden.shape
        fused = self._fused_weights()
        n_q, n_kv = self.n_heads, self.n_kv_heads
        for index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            w_qkv, b_qkv, _, w_gu, b_gu = fused[index]
            x = _rms_norm(hidden, layer.input_layernorm)
            # q|k|v as heads of one tensor: rotary is applied to q and k together, fewer small ops
            qkv = F.linear(x, w_qkv, b_qkv).view(batch, length, n_q + 2 * n_kv, self.head_dim).transpose(1, 2)
            qk = qkv[:, : n_q + n_kv]
            qk = qk * cos + _rotate_half(qk) * sin
            k, v = cache.layers[index].update(qk[:, n_q:], qkv[:, n_q + n_kv :])
            if length == 1 and mask.is_floating_point():  # a decoding step (kv_batch.decode)
                out = _single_query_attention(qk[:, :n_q], k, v, mask, attn.scaling)
            else:
                out = F.scaled_dot_product_attention(qk[:, :n_q], k, v, attn_mask=mask, scale=attn.scaling,
                                                     enable_gqa=self.gqa)
            out = out.transpose(1, 2).reshape(batch, length, -1)
            hidden = hidden + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            mlp = layer.mlp
            gate, up = F.linear(x, w_gu, b_gu).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        last = _rms_norm(hidden[:, -1], inner.norm)
        return F.linear(last, self.model.lm_head.weight, getattr(self.model.lm_head, "bias", None))

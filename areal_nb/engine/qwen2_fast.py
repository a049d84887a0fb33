"""A lean forward pass for Qwen2-architecture models (tiny-math, Qwen2.5) used by the engine.

The same arithmetic as transformers' `Qwen2ForCausalLM` (RMSNorm in fp32, rotary embeddings from
the model's own `rotary_emb`, sdpa attention, SiLU-gated MLP), read straight from the model's
parameters, without the per-module Python machinery. On small models a decode step is dominated
by that fixed overhead, not by arithmetic; removing it is what lets continuous batching profit
from rows leaving the batch. The projection matrices are copied once (fused, and on CPU prepacked
for oneDNN, see `_Linear`): after the model's weights change, `refresh()` must be called (the
engine does so after every weight update). Models of any other shape go through the stock
forward (`supports` says which).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def _rms_norm(hidden: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    dtype = hidden.dtype
    if dtype == torch.float32:  # one fused kernel, bitwise the same as the three-step form below
        return F.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)
    x = hidden.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [x2, x1] on the last axis, one copy. transformers' `rotate_half(x) * sin`
    is `_swap_halves(x) * _signed_sin(sin)`, bit for bit (a negation is exact)."""
    return x.roll(x.shape[-1] // 2, -1)  # a permutation: exact; cheaper than unflatten/flip/flatten


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _single_query_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Attention of one query per row (a decoding step): q [B, Hq, D] (already scaled), k/v
    [B, Hkv, L, D], `mask` additive [B * Hkv, 1, L] (-inf on padding); returns [B, Hq * D].

    Two batched matmuls and a softmax, the first matmul adding the mask as it goes (`baddbmm`).
    torch's CPU flash-attention kernel (what sdpa picks) is built for long queries and took about
    twice as long per decoding step at 128 rows. Query heads that share a key/value head (GQA) are
    laid out as that head's rows, so k/v are never repeated.
    """
    batch, n_q, dim = q.shape
    n_kv, width = k.shape[1], k.shape[2]
    q = q.reshape(batch * n_kv, n_q // n_kv, dim)
    scores = torch.baddbmm(mask, q, k.view(batch * n_kv, width, dim).transpose(1, 2))
    if scores.dtype == torch.float32:
        probs = torch.softmax(scores, dim=-1)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.bmm(probs, v.view(batch * n_kv, width, dim)).view(batch, n_q * dim)


_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class _Linear:
    """`F.linear(x, weight, bias)`, with the weight prepacked for oneDNN on CPU in fp32.

    torch's default CPU matmul (MKL sgemm) ran these small-batch projections 1.2-1.7x slower than
    oneDNN with a prepacked weight on this project's machines (AMD EPYC, where MKL does not pick
    its AVX-512 kernels). The results agree with F.linear to fp32 rounding (summation order).
    Other devices and dtypes use F.linear on the model's own tensors.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()  # no copies
        self.packed = None
        if _ONEDNN_LINEAR and weight.device.type == "cpu" and weight.dtype == torch.float32:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _fuse(linears: tuple[torch.nn.Linear, ...], first_scale: float = 1.0) -> _Linear:
    """One `_Linear` computing the concatenated outputs of `linears` (same input), the first one's
    outputs times `first_scale` (the attention scale folded into q: one multiplication fewer per
    layer and step; exact when the scale is a power of two, as 1/sqrt(head_dim) is for 16, 64, 256)."""
    weights = [lin.weight for lin in linears]
    biases = [
        lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0]) for lin in linears
    ]
    if first_scale != 1.0:
        weights[0], biases[0] = weights[0] * first_scale, biases[0] * first_scale
    weight = torch.cat(weights)
    if all(lin.bias is None for lin in linears):
        return _Linear(weight, None)
    return _Linear(weight, torch.cat(biases))


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
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    def _rope(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [B, 1, T, D] for `position_ids` [B, T].

        Default RoPE depends on the position only: its cos/sin are computed once for every position
        (the same elementwise arithmetic as `rotary_emb`, so the same values) and looked up, two
        operations per step instead of about ten. Other RoPE types (dynamic scaling) ask the model.
        """
        rotary = self.inner.rotary_emb
        if getattr(rotary, "rope_type", None) != "default":
            cos, sin = rotary(hidden, position_ids)
            return cos[:, None], _signed_sin(sin)[:, None]
        if self._rope_table is None:
            every = torch.arange(self.model.config.max_position_embeddings, device=hidden.device)[None]
            cos, sin = rotary(hidden, every)
            self._rope_table = (cos[0], _signed_sin(sin[0]))
        cos, sin = self._rope_table
        return cos[position_ids][:, None], sin[position_ids][:, None]

    def _rope_rows(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [B, 1, D] for one position per row, `positions` [B]."""
        cos, sin = self._rope(hidden, positions[:, None])  # [B, 1, 1, D]
        return cos[:, 0], sin[:, 0]

    def refresh(self) -> None:
        """Forget the copied projection weights; call after the model's weights changed."""
        self._fused = None

    def _fused_weights(self) -> list[tuple[_Linear, _Linear, _Linear, _Linear]]:
        # One matmul for q|k|v and one for gate|up instead of five: on a small model each
        # decoding step is dominated by per-operation overhead, not arithmetic.
        if self._fused is None:
            fused = []
            for layer in self.inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                fused.append(
                    (
                        _fuse((attn.q_proj, attn.k_proj, attn.v_proj), first_scale=attn.scaling),
                        _Linear(attn.o_proj.weight, attn.o_proj.bias),
                        _fuse((mlp.gate_proj, mlp.up_proj)),
                        _Linear(mlp.down_proj.weight, mlp.down_proj.bias),
                    )
                )
            head = self.model.lm_head
            self._lm_head = _Linear(head.weight, getattr(head, "bias", None))
            self._fused = fused
        return self._fused

    def decode(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, layers: list
    ) -> torch.Tensor:
        """Next-token logits [B, V] of one decoding step: the arithmetic of `packed_prefill.py` for
        one new token per row, written for that case (fewer operations per layer, no [B, 1, ...] axis).

        `input_ids` [B]: each row's last token; `positions` [B]: its position; `layers`: the cache
        layers, whose `append_column(k, v)` writes this step's keys/values [B, kv_heads, D] into
        the next free column and returns the whole buffers [B, kv_heads, W, D]; `mask`: additive
        [B * kv_heads, 1, W] over those W columns (-inf on padding and spare columns).
        """
        inner = self.inner
        fused = self._fused_weights()
        batch = input_ids.shape[0]
        n_q, n_kv, dim = self.n_heads, self.n_kv_heads, self.head_dim
        hidden = F.embedding(input_ids, inner.embed_tokens.weight)  # [B, hidden], updated in place below
        cos, sin = self._rope_rows(hidden, positions)
        for index, layer in enumerate(inner.layers):
            qkv_proj, o_proj, gate_up_proj, down_proj = fused[index]
            x = _rms_norm(hidden, layer.input_layernorm)
            qkv = qkv_proj(x).view(batch, n_q + 2 * n_kv, dim)
            qk = qkv[:, : n_q + n_kv]
            qk = torch.addcmul(qk * cos, _swap_halves(qk), sin)  # rotary on q and k at once
            k, v = layers[index].append_column(qk[:, n_q:], qkv[:, n_q + n_kv :])
            out = _single_query_attention(qk[:, :n_q], k, v, mask)  # q is scaled (see _fuse)
            hidden.add_(o_proj(out))
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            gate, up = gate_up_proj(x).chunk(2, dim=-1)
            hidden.add_(down_proj(F.silu(gate) * up))
        return self._lm_head(_rms_norm(hidden, inner.norm))

"""A lean forward pass for the common decoder families (Llama, Mistral, Qwen2, Qwen3, Gemma), used
by the engine's decoding steps and packed prefill.

These families share one layer shape (pre-norm RMSNorm, rotary q/k, grouped-query attention, a
gated MLP) and differ in a few places, each read from the model itself and computed as its
transformers implementation does (transformers 5.x):
- q/k/v/o and MLP biases where the checkpoint has them (Qwen2's q/k/v; Llama's `attention_bias`,
  `mlp_bias`);
- Qwen3: an RMSNorm over head_dim on every query and key head (`q_norm`, `k_norm`) before rotary;
- Gemma (1): embeddings times sqrt(hidden_size) in the model's dtype, RMSNorm times (1 + weight)
  (cast back after the multiplication, not before), the GELU-tanh gated MLP;
- the MLP activation of `hidden_act` (SiLU, GELU-tanh).
The arithmetic is read straight from the model's parameters, without the per-module Python
machinery. On small models a decoding step is dominated by that fixed overhead, not by arithmetic;
removing it is what lets continuous batching profit from rows leaving the batch. The projection
matrices are copied once (fused, and on CPU prepacked for oneDNN, see `_Linear`): after the
model's weights change, `refresh()` must be called (the engine does so after every weight update).
A LoRA policy served in place (`in_place_lora`) adds one low-rank product per fused projection
(`set_adapters`, at every push of adapters: the base's copies stay, the base is frozen).

Models of any other shape go through the stock forward (`supports` says which): other classes, a
sliding window that can bite within the model's positions (Mistral's default 4096 under a longer
context, Qwen's sliding layers), RoPE types whose cos/sin depend on more than the position
(dynamic NTK, LongRoPE: the table below cannot hold them), bidirectional Gemma, other activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from areal_nb.errors import ModelFileError

from ..api.attention_window import sliding_window
from ..api.in_place_adapters import LowRankAdapter
from .in_place_lora import LowRank, fused_low_rank

# class -> whether its RMSNorm multiplies by (1 + weight) (Gemma) rather than by weight
_FAMILIES = {
    "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": False,
    "Qwen3ForCausalLM": False,
    "GemmaForCausalLM": True,
}
# RoPE types whose cos/sin are a function of the position alone (a fixed inv_freq and scaling)
_TABLE_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}
# `hidden_act` -> what transformers' ACT2FN runs for it
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}


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
        self.bias = None if bias is None else bias.detach()  # (no copy)
        self.weight: torch.Tensor | None = weight.detach()
        self.packed = None
        if _ONEDNN_LINEAR and weight.device.type == "cpu" and weight.dtype == torch.float32:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            # the packed copy is all a call reads: a fused weight (`_fuse`'s concatenation, itself
            # a copy of the model's) is not kept beside it
            self.weight = None
        self.low_rank: LowRank | None = None  # a LoRA adapter served in place (`in_place_lora`)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        else:
            assert self.weight is not None
            out = F.linear(x, self.weight, self.bias)
        return out if self.low_rank is None else self.low_rank.add_to(out, x)


def _fuse(linears: tuple[torch.nn.Linear, ...], first_scale: float = 1.0) -> _Linear:
    """One `_Linear` computing the concatenated outputs of `linears` (same input), the first one's
    outputs times `first_scale` (the attention scale folded into q: one multiplication fewer per
    layer and step; exact when the scale is a power of two, as 1/sqrt(head_dim) is for 16, 64, 256)."""
    weights: list[torch.Tensor] = [lin.weight for lin in linears]
    biases: list[torch.Tensor] = [
        lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0]) for lin in linears
    ]
    if first_scale != 1.0:
        weights[0], biases[0] = weights[0] * first_scale, biases[0] * first_scale
    weight = torch.cat(weights)
    if all(lin.bias is None for lin in linears):
        return _Linear(weight, None)
    return _Linear(weight, torch.cat(biases))


def _weight(norm: torch.nn.Module) -> torch.Tensor:
    """A norm module's `weight` (`nn.Module` attributes are typed as tensor or module)."""
    weight = norm.weight
    if not isinstance(weight, torch.Tensor):
        raise ModelFileError(f"{type(norm).__name__}.weight is a {type(weight).__name__}, not a tensor")
    return weight.detach()


def _epsilon(norm: torch.nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


class _RMSNorm:
    """An RMSNorm module's arithmetic: `weight * normed.to(dtype)` (Llama, Qwen) or, for Gemma,
    `(normed * (1 + weight)).to(dtype)`, the normalisation in fp32 either way. In fp32 one fused
    kernel (`F.rms_norm`), bitwise the same as the three-step form."""

    def __init__(self, norm: torch.nn.Module, plus_one: bool) -> None:
        weight = _weight(norm)
        self.eps = _epsilon(norm)
        self.plus_one = plus_one
        self.weight = 1.0 + weight.float() if plus_one else weight  # Gemma's: fp32, as it multiplies
        self.shape = tuple(weight.shape)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        if dtype == torch.float32:
            return F.rms_norm(hidden, self.shape, self.weight, self.eps)
        x = hidden.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.plus_one:
            return (x * self.weight).to(dtype)
        return self.weight * x.to(dtype)


class _HeadNorm:
    """Qwen3's `q_norm`/`k_norm` (RMSNorm over head_dim) on the query and key heads [N, q + kv
    heads, D] at once: one normalisation, then each head's weight (the query weights times the
    attention scale, which the fused projection cannot carry here: a norm follows it)."""

    def __init__(self, q_norm: torch.nn.Module, k_norm: torch.nn.Module, n_q: int, n_kv: int, scale: float):
        self.eps = _epsilon(q_norm)
        q_weight, k_weight = _weight(q_norm) * scale, _weight(k_norm)
        self.weight = torch.cat([q_weight.expand(n_q, -1), k_weight.expand(n_kv, -1)])  # [heads, D]

    def __call__(self, qk: torch.Tensor) -> torch.Tensor:
        dtype = qk.dtype
        if dtype == torch.float32:
            return F.rms_norm(qk, (qk.shape[-1],), None, self.eps) * self.weight
        x = qk.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _attention_linears(attn: Any) -> tuple[torch.nn.Linear, ...]:
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj


def _mlp_linears(mlp: Any) -> tuple[torch.nn.Linear, ...]:
    return mlp.gate_proj, mlp.up_proj, mlp.down_proj


class ColumnCache(Protocol):
    """A cache layer `LeanForward.decode` writes a decoding step's keys/values into."""

    def append_column(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class _Layer(NamedTuple):
    input_norm: _RMSNorm
    qkv: _Linear  # q (times the attention scale unless `head_norm` carries it) | k | v
    head_norm: _HeadNorm | None
    o: _Linear
    post_norm: _RMSNorm
    gate_up: _Linear
    down: _Linear


class LeanForward:
    """The engine's forward for the families in `_FAMILIES` (see the module docstring).

    `decode` runs one decoding step; `packed_prefill.packed_prefill` runs prompts with the same
    per-token pieces (`embed`, `qkv`, `mlp`, `logits`)."""

    @staticmethod
    def supports(model: PreTrainedModel) -> bool:
        cfg = model.config
        inner = getattr(model, "model", None)
        rotary = getattr(inner, "rotary_emb", None)
        window = sliding_window(cfg)
        return (
            type(model).__name__ in _FAMILIES
            and rotary is not None
            and getattr(rotary, "rope_type", None) in _TABLE_ROPE_TYPES
            and (window is None or window >= cfg.max_position_embeddings)  # no key ever falls out
            and getattr(cfg, "hidden_act", None) in _ACTIVATIONS
            and not getattr(cfg, "use_bidirectional_attention", False)
        )

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.inner = model.model
        cfg = model.config
        attn = self.inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.gqa = cfg.num_key_value_heads != cfg.num_attention_heads
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self._plus_one = _FAMILIES[type(model).__name__]
        self._layers: list[_Layer] | None = None
        self._lm_head: _Linear | None = None
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        self.adapters: dict[str, LowRankAdapter] = {}  # by module name: LoRA served in place

    def refresh(self) -> None:
        """Forget the copied weights (their memory goes now, the next forward copies them again);
        call after the model's weights changed."""
        self._layers = None
        self._lm_head = None

    def set_adapters(self, adapters: dict[str, LowRankAdapter]) -> None:
        """Add each adapter's low-rank term to its module's projection (`in_place_lora`); call at
        every push of adapters. Only the low-rank terms are rebuilt: the base's fused and packed
        copies stay (the base is frozen)."""
        self.adapters = adapters
        if self._layers is not None:
            self._attach_low_rank(self._layers)

    def projection_modules(self) -> set[str]:
        """The names of the linear modules whose outputs the layers compute (what an adapter may
        be on)."""
        linears = {
            id(linear)
            for layer in self.inner.layers
            for linear in (*_attention_linears(layer.self_attn), *_mlp_linears(layer.mlp))
        }
        return {name for name, module in self.model.named_modules() if id(module) in linears}

    def _attach_low_rank(self, layers: list[_Layer]) -> None:
        names = {id(module): name for name, module in self.model.named_modules()}
        for fused, module in zip(layers, self.inner.layers, strict=True):
            attn, mlp = module.self_attn, module.mlp
            q_scale = attn.scaling if fused.head_norm is None else 1.0  # as the fused q weight
            q, k, v, o = _attention_linears(attn)
            gate, up, down = _mlp_linears(mlp)
            for projection, linears, scale in (
                (fused.qkv, (q, k, v), q_scale),
                (fused.o, (o,), 1.0),
                (fused.gate_up, (gate, up), 1.0),
                (fused.down, (down,), 1.0),
            ):
                projection.low_rank = fused_low_rank(
                    [self.adapters.get(names[id(linear)]) for linear in linears],
                    [linear.out_features for linear in linears],
                    scale,
                )

    def weights(self) -> list[_Layer]:
        # One matmul for q|k|v and one for gate|up instead of five: on a small model each
        # decoding step is dominated by per-operation overhead, not arithmetic.
        if self._layers is None:
            layers = []
            for layer in self.inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                q_norm = getattr(attn, "q_norm", None)
                layers.append(
                    _Layer(
                        input_norm=_RMSNorm(layer.input_layernorm, self._plus_one),
                        qkv=_fuse(
                            (attn.q_proj, attn.k_proj, attn.v_proj),
                            first_scale=attn.scaling if q_norm is None else 1.0,
                        ),
                        head_norm=None
                        if q_norm is None
                        else _HeadNorm(q_norm, attn.k_norm, self.n_heads, self.n_kv_heads, attn.scaling),
                        o=_Linear(attn.o_proj.weight, attn.o_proj.bias),
                        post_norm=_RMSNorm(layer.post_attention_layernorm, self._plus_one),
                        gate_up=_fuse((mlp.gate_proj, mlp.up_proj)),
                        down=_Linear(mlp.down_proj.weight, mlp.down_proj.bias),
                    )
                )
            head = self.model.lm_head
            self._lm_head = _Linear(head.weight, getattr(head, "bias", None))
            self._final_norm = _RMSNorm(self.inner.norm, self._plus_one)
            embed = self.inner.embed_tokens
            scale = getattr(embed, "embed_scale", None)  # Gemma's sqrt(hidden_size), in the weights' dtype
            self._embed_scale = None if scale is None else scale.to(embed.weight.dtype)
            self._attach_low_rank(layers)
            self._layers = layers
        return self._layers

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of `ids` (a fresh tensor: the callers add to it in place)."""
        self.weights()
        hidden = F.embedding(ids, self.inner.embed_tokens.weight)
        return hidden if self._embed_scale is None else hidden * self._embed_scale

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [N, 1, D] for one position per token, `positions` [N].

        The RoPE types `supports` admits depend on the position only: cos/sin are computed once for
        every position by the model's own `rotary_emb` (so the same values) and looked up, two
        operations per step instead of about ten.
        """
        if self._rope_table is None:
            every = torch.arange(self.model.config.max_position_embeddings, device=hidden.device)[None]
            cos, sin = self.inner.rotary_emb(hidden, every)
            self._rope_table = (cos[0], _signed_sin(sin[0]))
        cos, sin = self._rope_table
        return cos[positions][:, None], sin[positions][:, None]

    def qkv(
        self, layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (scaled), rotated keys and values [N, heads, D] of tokens `hidden` [N, hidden]."""
        n_q, n_kv = self.n_heads, self.n_kv_heads
        qkv = layer.qkv(layer.input_norm(hidden)).view(hidden.shape[0], n_q + 2 * n_kv, self.head_dim)
        qk = qkv[:, : n_q + n_kv]
        if layer.head_norm is not None:
            qk = layer.head_norm(qk)
        qk = torch.addcmul(qk * cos, _swap_halves(qk), sin)  # rotary on q and k at once
        return qk[:, :n_q], qk[:, n_q:], qkv[:, n_q + n_kv :]

    def mlp(self, layer: _Layer, hidden: torch.Tensor) -> torch.Tensor:
        """The MLP's output (to add to `hidden`)."""
        gate, up = layer.gate_up(layer.post_norm(hidden)).chunk(2, dim=-1)
        return layer.down(self.act(gate) * up)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self._lm_head is not None, "weights() first"
        return self._lm_head(self._final_norm(hidden))

    def decode(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        layers: Sequence[ColumnCache],
    ) -> torch.Tensor:
        """Next-token logits [B, V] of one decoding step: the arithmetic of `packed_prefill.py` for
        one new token per row, written for that case (fewer operations per layer, no [B, 1, ...] axis).

        `input_ids` [B]: each row's last token; `positions` [B]: its position; `layers`: the cache
        layers, whose `append_column(k, v)` writes this step's keys/values [B, kv_heads, D] into
        the next free column and returns the whole buffers [B, kv_heads, W, D]; `mask`: additive
        [B * kv_heads, 1, W] over those W columns (-inf on padding and spare columns).
        """
        hidden = self.embed(input_ids)  # [B, hidden], updated in place below
        cos, sin = self.rope(hidden, positions)
        for index, layer in enumerate(self.weights()):
            q, k, v = self.qkv(layer, hidden, cos, sin)
            k, v = layers[index].append_column(k, v)
            hidden.add_(layer.o(_single_query_attention(q, k, v, mask)))
            hidden.add_(self.mlp(layer, hidden))
        return self.logits(hidden)

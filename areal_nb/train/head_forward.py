"""The flat trie's forward with the last decoder layer computed only where logits are read.

A node's output of the last decoder layer feeds nothing but its own logits, and the loss reads
logits only at the parents of generated tokens (the "heads"): 8-9 % of the nodes of the
multi-turn demo batch, whose correction message and prompts are context only. Every other node
still needs the last layer's keys and values (the heads attend to them), but not its query,
attention output, output projection or MLP: ~85 % of a layer's work for ~90 % of the nodes,
about a fifth of the whole forward and backward of a 4-layer model. The values computed are
the same operations on the same inputs as the full forward's, so log-probs and gradients equal
it up to float rounding (tests/train/test_tree_attention.py).

It walks the decoder itself (embedding, rotary table, layers, final norm), so it runs only for
the Llama-style models whose layers it knows (`_HEAD_FORWARD_MODEL_TYPES`: pre-norm attention
with q/k/v/o projections and rotary positions, then an MLP, no query/key norms) and not under FSDP;
other models run the whole forward and read the heads' logits (`logits_to_keep`).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from .tree_attention import TreePlan, tree_attention_forward

_HEAD_FORWARD_MODEL_TYPES = ("qwen2", "llama")


def supports_head_forward(model: torch.nn.Module) -> bool:
    """Whether `head_hidden` knows `model`'s decoder layout. Not under FSDP: the sharded root
    gathers its own parameters (embedding, final norm, LM head) in its forward, which this skips."""
    if is_fsdp(model):
        return False
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if getattr(config, "model_type", None) not in _HEAD_FORWARD_MODEL_TYPES or inner is None:
        return False
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    attention = inner.layers[-1].self_attn
    return (
        hasattr(model, "lm_head")
        and not hasattr(attention, "q_norm")
        and all(
            hasattr(attention, name)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
        )
    )


def is_fsdp(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 cannot have sharded it
        return False
    return isinstance(model, FSDPModule)


def head_hidden(
    model: torch.nn.Module,
    tokens: Tensor,
    position_ids: Tensor,
    plan: TreePlan,
    heads: Tensor,
    head_plan: TreePlan,
) -> Tensor:
    """The final (normed) hidden states `[len(heads), D]` at nodes `heads` of the flat trie
    `tokens` / `position_ids` `[T]` (`model.lm_head` of them: the logits there): every layer but
    the last over all nodes with `plan`, the last one's queries at the heads only (`head_plan`:
    `plan_tree_attention(..., queries=heads)`). Run inside `tree_attention(model)`."""
    causal_lm: Any = model  # a transformers *ForCausalLM: its modules and config by name
    inner = causal_lm.model
    hidden = inner.embed_tokens(tokens[None])  # [1, T, D]
    positions = position_ids[None]
    cos_sin = inner.rotary_emb(hidden, positions)
    *layers, last = inner.layers[: causal_lm.config.num_hidden_layers]
    for layer in layers:  # the model's own layers, attention through the tree plan
        hidden = layer(
            hidden, attention_mask=plan, position_ids=positions, position_embeddings=cos_sin, use_cache=False
        )
    hidden = _last_layer_at(last, hidden, cos_sin, heads, head_plan)  # [1, Q, D]
    return inner.norm(hidden)[0]


def _last_layer_at(
    layer: Any, hidden: Tensor, cos_sin: tuple[Tensor, Tensor], heads: Tensor, head_plan: TreePlan
) -> Tensor:
    """The decoder layer's output at `heads` only: keys and values of all nodes, the rest at the
    heads (the layer's own modules and its model's rotary function, in the layer's order)."""
    attention = layer.self_attn
    rotate_half = sys.modules[type(attention).__module__].rotate_half
    cos, sin = (x.unsqueeze(1) for x in cos_sin)  # [1, 1, T, d]: broadcast over heads
    normed = layer.input_layernorm(hidden)
    n_nodes, n_heads, dim = hidden.shape[1], len(heads), attention.head_dim
    key = attention.k_proj(normed).view(1, n_nodes, -1, dim).transpose(1, 2)
    value = attention.v_proj(normed).view(1, n_nodes, -1, dim).transpose(1, 2)
    query = attention.q_proj(normed[:, heads]).view(1, n_heads, -1, dim).transpose(1, 2)
    key = key * cos + rotate_half(key) * sin
    query = query * cos[:, :, heads] + rotate_half(query) * sin[:, :, heads]
    out, _ = tree_attention_forward(attention, query, key, value, head_plan, scaling=attention.scaling)
    hidden = hidden[:, heads] + attention.o_proj(out.reshape(1, n_heads, -1))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

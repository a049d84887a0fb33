"""What one training step needs on the GPU, estimated before the first step.

An out-of-memory error in the middle of a run loses the rollouts it was training on and says
nothing about which setting to change. So the Actor estimates, on CUDA, the memory its step adds
to what the model already holds, and refuses a config that cannot fit, naming the setting.

The estimate (bytes; P trainable parameters, c bytes per compute-dtype value, per micro-batch
of T tokens through L layers of hidden size h and MLP size i, vocabulary V):

- gradients 4P and AdamW's two moments 8P (float32; divided by the ranks under FSDP), and with
  a compute dtype narrower than float32 its copy of the weights cP (autocast's cast cache);
- activations kept for the backward: about (8h + c(6h + 5i)) per token per layer (the float32
  residual stream and norm inputs, then the projections' inputs and outputs in the compute
  dtype); with gradient checkpointing only each layer's input (4h per token per layer) plus one
  layer's activations;
- the log-softmax: (c + 12) V per token of a chunk (logits, their float32 scaled copy,
  log-softmax and its exponential), for `logprob_chunk_size` tokens, or for all T unchunked.

It is an estimate (attention kernels, allocator fragmentation and the engine's growth are not
in it), so a config is refused only when it exceeds the free memory; `_HEADROOM` is kept free.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_nb.errors import TrainMemoryError

_GIB = 1024**3
_HEADROOM = 0.9  # the fraction of free memory a step may plan to use


@dataclass
class ModelShape:
    """What the estimate reads from a causal LM's config."""

    params: int  # trainable parameters
    layers: int
    hidden: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model) -> ModelShape:
        config = model.config
        text = getattr(config, "text_config", None) or config
        return cls(
            params=sum(p.numel() for p in model.parameters() if p.requires_grad),
            layers=text.num_hidden_layers,
            hidden=text.hidden_size,
            intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
            vocab=text.vocab_size,
        )


@dataclass
class TrainMemoryEstimate:
    """Bytes a train step adds to the weights already on the device."""

    optimizer: int  # gradients, AdamW moments, the compute-dtype copy of the weights
    activations: int  # per micro-batch, kept for the backward
    logprobs: int  # the log-softmax of one chunk (or of the whole micro-batch)
    tokens: int | None  # the micro-batch's tokens the activations assume (None: unknown)

    @property
    def total(self) -> int:
        return self.optimizer + self.activations + self.logprobs


def estimate_train_memory(
    shape: ModelShape,
    tokens: int | None,
    compute_bytes: int,
    shards: int = 1,
    gradient_checkpointing: bool = False,
    chunk: int = 0,
) -> TrainMemoryEstimate:
    """The estimate above for micro-batches of `tokens` tokens (None: activations not counted)."""
    cast_copy = compute_bytes * shape.params if compute_bytes < 4 else 0
    optimizer = (12 * shape.params + cast_copy) // shards
    h, i = shape.hidden, shape.intermediate
    per_layer = 8 * h + compute_bytes * (6 * h + 5 * i)  # per token
    activations = logprobs = 0
    if tokens is not None:
        if gradient_checkpointing:
            activations = tokens * (shape.layers * 4 * h + per_layer)
        else:
            activations = tokens * shape.layers * per_layer
        logprobs = (min(chunk, tokens) if chunk else tokens) * shape.vocab * (compute_bytes + 12)
    return TrainMemoryEstimate(optimizer, activations, logprobs, tokens)


def check_fits(estimate: TrainMemoryEstimate, free_bytes: int) -> None:
    """Raise `TrainMemoryError` naming what to change when the estimate exceeds `free_bytes`."""
    budget = int(free_bytes * _HEADROOM)
    if estimate.optimizer > budget:
        raise TrainMemoryError(
            f"training needs ~{_gib(estimate.optimizer)} GiB for gradients and AdamW state, "
            f"{_gib(free_bytes)} GiB of device memory is free: shard them over several GPUs "
            "(actor.parallel=fsdp under torchrun), or train a smaller model"
        )
    if estimate.total > budget:
        raise TrainMemoryError(
            f"a micro-batch of {estimate.tokens} tokens needs ~{_gib(estimate.activations)} GiB of activations and "
            f"~{_gib(estimate.logprobs)} GiB for the log-softmax beside ~{_gib(estimate.optimizer)} GiB of "
            f"gradients and AdamW state; {_gib(free_bytes)} GiB is free: lower actor.max_tokens_per_microbatch, "
            "or set actor.gradient_checkpointing=true, or lower actor.logprob_chunk_size"
        )


def _gib(n: int) -> str:
    return f"{n / _GIB:.1f}"


def check_train_memory(model, cfg, compute_dtype, free_bytes: int, shards: int = 1) -> TrainMemoryEstimate:
    """Estimate `model`'s train step under `cfg` (a `GRPOConfig`) and check it against `free_bytes`."""
    import torch

    estimate = estimate_train_memory(
        ModelShape.of(model),
        cfg.max_tokens_per_microbatch,
        torch.finfo(compute_dtype).bits // 8,
        shards=shards,
        gradient_checkpointing=cfg.gradient_checkpointing,
        chunk=cfg.logprob_chunk_size,
    )
    check_fits(estimate, free_bytes)
    return estimate

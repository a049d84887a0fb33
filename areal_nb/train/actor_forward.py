"""The Actor's forwards: its micro-batches of a step's rows, and the per-row token log-probs and
entropy they compute (packed into tries or padded), with or without gradients."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .logprobs import compute_token_logprobs_and_entropy
from .lora import lora_base, use_adapter
from .microbatch import split_micro_batches
from .packing import pack_rows, packed_token_logprobs_and_entropy
from .precision import autocast
from .step_batch import StepBatch, micro_allowed
from .tree_attention import supports_tree_attention

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["empty_pass", "logprobs_no_grad", "micro_batches", "row_logprobs", "use_adapter_of"]


def micro_batches(actor: Actor, rows: Tensor, step: StepBatch) -> list[Tensor]:
    """The micro-batches of `rows` this process computes (all rows without data parallelism);
    through the sharded model, as many as every other rank (some empty). With agent adapters
    each micro-batch holds one agent's rows (a forward runs one adapter)."""
    cfg = actor.cfg
    if step.row_agents is not None:
        by_agent: dict[str, list[int]] = {}
        for row in rows.tolist():
            by_agent.setdefault(step.row_agents[row], []).append(row)
        agent_step = replace(step, row_agents=None)
        return [
            micro
            for agent_rows in by_agent.values()
            for micro in micro_batches(actor, torch.tensor(agent_rows, device=rows.device), agent_step)
        ]
    if actor.parallel is None:
        return split_micro_batches(rows, step.lengths, cfg.micro_batch_size, cfg.max_tokens_per_microbatch)
    same_count = actor.sharded  # (the policy and the reference alike)
    return actor.parallel.micro_batches(
        rows,
        step.lengths,
        cfg.micro_batch_size,
        same_count=same_count,
        pack_ids=step.pack_ids if same_count and cfg.pack else None,
        max_tokens=cfg.max_tokens_per_microbatch,
    )


def use_adapter_of(actor: Actor, step: StepBatch, micro: Tensor) -> None:
    """Agent adapters: the next forwards run the adapter of `micro`'s agent (one per micro-batch)."""
    if step.row_agents is not None:
        use_adapter(actor.model, step.row_agents[int(micro[0])])


def row_logprobs(
    actor: Actor,
    model: torch.nn.Module,
    input_ids: Tensor,
    attention: Tensor,
    pack_ids: Tensor | None,
    needed: Tensor | None = None,
    allowed: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, int]:
    """Token log-probs and entropy `[b, width]` of right-padded rows, in the compute dtype
    (autocast; under FSDP its policy casts), through one trie per pack id (`cfg.pack`) or the
    padded rows, and the number of positions the model computed. With `needed` (bool
    `[b, width]`) the packed forward may leave the other positions at 0. With `allowed`
    (`step_batch.micro_allowed`) the padded rows run, those tokens renormalised over their allowed sets
    (the packed forward does not take masks)."""
    model = lora_base(model)  # LoRA: the base with its injected adapters (the fast paths walk its layers)
    with autocast(actor.device, None if actor.sharded else actor.compute_dtype):
        if actor.cfg.pack and allowed is None:
            flat = actor.cfg.tree_attention and supports_tree_attention(model)
            packed = pack_rows(input_ids, attention, pack_ids, flat=flat)
            logprobs, entropy = packed_token_logprobs_and_entropy(
                model,
                packed,
                actor.temperature,
                positions=needed,
                last_layer_at_heads=actor.cfg.last_layer_at_heads,
                chunk=actor.cfg.logprob_chunk_size,
            )
            assert entropy is not None
            return logprobs, entropy, packed.n_nodes
        logprobs, entropy = compute_token_logprobs_and_entropy(
            model,
            input_ids,
            attention,
            actor.temperature,
            chunk=actor.cfg.logprob_chunk_size,
            allowed=allowed,
        )
        return logprobs, entropy, input_ids.numel()


@torch.no_grad()
def logprobs_no_grad(actor: Actor, model: torch.nn.Module, step: StepBatch) -> Tensor:
    """Log-probs of every row (at least on the loss mask); data-parallel, each rank computes
    its micro-batches and the ranks sum their (otherwise zero) rows."""
    input_ids, attention, pack_ids = step.input_ids, step.attention, step.pack_ids
    rows = torch.arange(step.n_rows, device=input_ids.device)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for micro in micro_batches(actor, rows, step):
        if not len(micro):
            empty_pass(actor, model, input_ids, backward=False)
            continue
        width = int(attention[micro].sum(1).max())
        if model is actor.model:
            use_adapter_of(actor, step, micro)
        out[micro, :width] = row_logprobs(
            actor,
            model,
            input_ids[micro, :width],
            attention[micro, :width],
            None if pack_ids is None else pack_ids[micro],
            step.mask[micro, :width],
            micro_allowed(step, micro, width),
        )[0]
    if actor.parallel is not None:
        actor.parallel.sum_(out)
    return out


def empty_pass(actor: Actor, model: torch.nn.Module, input_ids: Tensor, backward: bool) -> None:
    """A forward (and backward) of one token with zero loss: under FSDP every rank must run
    the same number of passes (each gathers and reduce-scatters with the others)."""
    with autocast(actor.device, None if actor.sharded else actor.compute_dtype):
        logits = lora_base(model)(input_ids=input_ids[:1, :1], use_cache=False).logits
    if backward:
        (logits.float().sum() * 0.0).backward()

"""One train step's batch as the Actor's phases read it: on the model's device, its loss mask,
packing groups, each row's agent and the replayed sampling masks (`StepBatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import InvalidArgumentError, TrainBatchError

from .advantages import group_index

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["StepBatch", "micro_allowed", "prepare_step", "row_agents"]


@dataclass
class StepBatch:
    """One train step's validated batch and what every phase reads from it."""

    batch: TrainBatch  # on the model's device
    input_ids: Tensor  # [B, L]
    attention: Tensor  # [B, L] bool, right-padded
    mask: Tensor  # [B, L] bool: the generated tokens the loss trains on
    engine_logprobs: Tensor  # [B, L] float32: π_behave, as the engine recorded it
    group_ids: Tensor | None  # [B]: the batch's, for the advantages' baselines
    pack_ids: Tensor | None  # [B] dense group index: the rows merged into one trie
    lengths: Tensor  # [B] tokens per row
    # agent adapters (`Actor(agent_lora=...)`): each row's agent, whose adapter its forwards run
    row_agents: list[str] | None = None
    # `cfg.replay_sampling_masks`: per row with masked tokens, their positions [k] and allowed sets [k, V]
    allowed: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]


def prepare_step(actor: Actor, batch: TrainBatch) -> StepBatch:
    """The batch on the model's device, its loss mask and its packing groups."""
    batch = batch.to(actor.device)
    input_ids, attention = batch.input_ids, batch.attention_mask
    n_rows = input_ids.shape[0]
    if n_rows < actor.cfg.ppo_n_minibatches:
        raise TrainBatchError(
            f"batch has {n_rows} rows, fewer than ppo_n_minibatches={actor.cfg.ppo_n_minibatches}"
        )
    group_ids = batch.group_ids
    pack_ids = group_index(group_ids, n_rows).to(input_ids.device) if group_ids is not None else None
    engine_logprobs, allowed = batch.logprobs.float(), {}
    if actor.cfg.replay_sampling_masks and batch.sampling_logprobs is not None:
        # π_behave: the recorded log-probs under the distribution each token was sampled from
        engine_logprobs, allowed = batch.sampling_logprobs.float(), _allowed_sets(actor, batch)
    return StepBatch(
        batch=batch,
        input_ids=input_ids,
        attention=attention,
        mask=batch.loss_mask.bool() & attention,
        engine_logprobs=engine_logprobs,
        group_ids=group_ids,
        pack_ids=pack_ids,
        lengths=attention.sum(1),
        allowed=allowed,
    )


def row_agents(actor: Actor, batch: TrainBatch, agents: Sequence[str | None] | None) -> list[str] | None:
    """Each row's agent (agent adapters only), checked to have an adapter."""
    if not actor.agents:
        return None
    if agents is None or batch.agent_ids is None:
        raise TrainBatchError(
            f"this Actor trains one adapter per agent ({actor.agents}): train_step needs "
            "batch.agent_ids and the agents' names (agents=)"
        )
    names = [agents[int(i)] for i in batch.agent_ids.tolist()]
    strangers = sorted({str(n) for n in names if n not in actor.agents})
    if strangers:
        raise TrainBatchError(
            f"rows of agent(s) {strangers}, which have no adapter: this Actor trains {actor.agents}"
        )
    return [str(n) for n in names]


def _allowed_sets(actor: Actor, batch: TrainBatch) -> dict[int, tuple[Tensor, Tensor]]:
    """Each masked token's allowed set, rebuilt from the batch's `sampling_spans` (the grammar
    replayed over the recorded output with this Actor's tokenizer, or the kept ids)."""
    vocab = int(actor.model.get_input_embeddings().num_embeddings)  # the engine's mask width
    masked, spans_per_row = batch.sampling_masked, batch.sampling_spans
    if masked is None or spans_per_row is None:
        raise TrainBatchError("TrainBatch.sampling_logprobs comes with sampling_masked and sampling_spans")
    out: dict[int, tuple[Tensor, Tensor]] = {}
    for row, spans in enumerate(spans_per_row):
        positions, sets = [], []
        for span in spans:
            if span.masks.constraint is not None and actor.tokenizer is None:
                raise InvalidArgumentError(
                    "replaying a recorded grammar needs the tokenizer: Actor(..., tokenizer=...)"
                )
            allowed = span.masks.allowed(span.tokens, actor.tokenizer, vocab)
            for i, pos in span.positions(masked.shape[1]):
                if bool(masked[row, pos]):
                    positions.append(pos)
                    sets.append(allowed[i])
        if positions:
            out[row] = (torch.tensor(positions, dtype=torch.long), torch.stack(sets))
    return out


def micro_allowed(step: StepBatch, micro: Tensor, width: int) -> tuple[Tensor, Tensor] | None:
    """The allowed sets of a micro-batch's masked tokens as (`positions [k, 2]`, bool `[k, V]`)."""
    positions, sets = [], []
    for local, row in enumerate(micro.tolist()):
        if row in step.allowed:
            pos, allowed = step.allowed[row]
            keep = pos < width
            positions.append(torch.stack([torch.full_like(pos[keep], local), pos[keep]], dim=1))
            sets.append(allowed[keep])
    if not positions:
        return None
    device = step.input_ids.device
    return torch.cat(positions).to(device), torch.cat(sets).to(device)

"""`TrainBatch`: the one thing a training step takes, typed and checked once.

The rollout side builds it (`RolloutBatch.to_tensors()`), `Actor.train_step` and the lab take it;
it lives here, below both, because `rollout` may not import `train`. Every field is a named
attribute (no string keys on the training path), the row metadata is carried once (`group_ids`
is a field, not a second argument), and a batch that cannot be trained on is refused when it is
made, with a `TrainBatchError` naming the field, or an `ArgumentTypeError` for a field that is not
a tensor. Rows are right-padded: `[B, L]` per token, `[B]` per row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from areal_nb.errors import ArgumentTypeError, TrainBatchError

__all__ = ["TrainBatch"]

# the optional fields shaped like input_ids
_TOKEN_FIELDS = (
    "versions",
    "turn_ids",
    "turn_returns",
    "ref_logprobs",
    "sampling_logprobs",
    "sampling_masked",
)
_ROW_FIELDS = ("group_ids", "agent_ids", "episode_ids")


@dataclass(frozen=True)
class TrainBatch:
    """One training step's rows: `[B, L]` token tensors, `[B]` row tensors and their metadata."""

    input_ids: Tensor
    """`[B, L]` int64: prompt and output tokens of each row, right-padded."""
    attention_mask: Tensor
    """`[B, L]` bool: ones then zeros (right padding); stored as bool whatever it was given as."""
    loss_mask: Tensor
    """`[B, L]`: 1 on the generated tokens the loss trains on, 0 on prompts and padding."""
    logprobs: Tensor
    """`[B, L]` float32: the engine's log-prob of each generated token (π_behave), 0 elsewhere."""
    rewards: Tensor
    """`[B]` float32: each row's reward, discounted back through the turns (by the RolloutBatch)."""
    versions: Tensor | None = None
    """`[B, L]` int64: the policy version that sampled each generated token, -1 elsewhere."""
    turn_ids: Tensor | None = None
    """`[B, L]` int64: the turn each token belongs to (`credit="turn"` and the loss views)."""
    turn_returns: Tensor | None = None
    """`[B, L]` float32: each generated token's own turn's discounted return (`credit="turn"`)."""
    group_ids: Tensor | None = None
    """`[B]` int64: each row's group, `group · A + agent` (GRPO's groups are (prompt, agent) pairs);
    the advantages' baselines and the trainer's prefix packing read it. None: one group per row."""
    agent_ids: Tensor | None = None
    """`[B]` int64: each row's agent, an index into the RolloutBatch's `agents`."""
    episode_ids: Tensor | None = None
    """`[B]` int64: each row's episode, an index into the RolloutBatch's `episodes`."""
    ref_logprobs: Tensor | None = None
    """`[B, L]` float32: the KL reference's log-probs, when computed elsewhere (else the Actor's
    reference model computes them when `kl_ctl > 0`)."""
    sampling_logprobs: Tensor | None = None
    """`[B, L]` float32: with masked sampling, the engine's log-prob under the distribution it
    sampled from (`logprobs` at unmasked tokens)."""
    sampling_masked: Tensor | None = None
    """`[B, L]` bool: the tokens sampled under a mask (with `sampling_logprobs`)."""
    sampling_spans: Sequence[Sequence[Any]] | None = None
    """Per row, its `capture.SamplingSpan`s: enough to rebuild each masked token's allowed set."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "sampling_spans" and value is not None and not isinstance(value, Tensor):
                raise ArgumentTypeError(
                    f"TrainBatch.{f.name} must be a torch.Tensor, got {type(value).__name__}"
                )
        if self.input_ids.dim() != 2:
            raise TrainBatchError(
                f"TrainBatch.input_ids must be [B, L], got shape {tuple(self.input_ids.shape)}"
            )
        shape = self.input_ids.shape
        for name in ("attention_mask", "loss_mask", "logprobs", *_TOKEN_FIELDS):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise TrainBatchError(
                    f"TrainBatch.{name} has shape {tuple(value.shape)}, input_ids {tuple(shape)}"
                )
        if self.rewards.numel() != shape[0]:
            raise TrainBatchError(
                f"TrainBatch.rewards has {self.rewards.numel()} entries for {shape[0]} rows"
            )
        for name in _ROW_FIELDS:
            value = getattr(self, name)
            if value is not None and value.numel() != shape[0]:
                raise TrainBatchError(f"TrainBatch.{name} has {value.numel()} entries for {shape[0]} rows")
        if self.sampling_spans is not None and len(self.sampling_spans) != shape[0]:
            raise TrainBatchError(
                f"TrainBatch.sampling_spans has {len(self.sampling_spans)} rows, input_ids {shape[0]}"
            )
        attention = self.attention_mask.bool()
        lengths = attention.sum(1, keepdim=True)
        if not torch.equal(attention, torch.arange(shape[1], device=attention.device) < lengths):
            raise TrainBatchError(
                "TrainBatch.attention_mask must be right-padded: each row is ones then zeros"
            )
        object.__setattr__(self, "attention_mask", attention)

    @property
    def n_rows(self) -> int:
        """B, the number of rows."""
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        """The same batch with every tensor on `device` (itself when they are all there)."""
        moved: dict[str, Any] = {
            f.name: value.to(device)
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), Tensor) and value.device != torch.device(device)
        }
        return dataclasses.replace(self, **moved) if moved else self

    def replace(self, **changes: Any) -> TrainBatch:
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)

    def tensors(self) -> dict[str, Tensor]:
        """The fields that are set and are tensors, by name (for the views and `compute_advantages`)."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), Tensor)
        }

"""`LossInspection`: the per-token values of one train step, kept by `train_step(inspect=True)`.

Rows are those of the training batch (right padding, `[B, L]`); every tensor is on the CPU and
detached. Values are those of the update itself: ratio and clipping come from the forward pass
that produced the gradient, so with several minibatches a later minibatch's rows see weights
already moved by the earlier ones, exactly as the optimizer did.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

# Per-token tensors in `row()` order; all [B, L].
_TOKEN_FIELDS = (
    "input_ids",
    "loss_mask",
    "turn_ids",
    "logprobs",
    "old_logprobs",
    "prox_logprobs",
    "advantages",
    "ratio",
    "clipped",
    "dual_clipped",
    "behave_weight",
    "behave_capped",
    "entropy",
    "contribution",
)


@dataclass
class LossInspection:
    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor  # the tokens the loss saw (generated, inside the attention mask)
    turn_ids: Tensor | None  # generated turn of each token (-1 elsewhere), when the batch has them
    logprobs: Tensor  # π_θ at the forward pass of the update (loss-mask tokens; 0 elsewhere with actor.pack)
    old_logprobs: Tensor  # π_old of the clipped ratio (engine record, or recomputed)
    prox_logprobs: Tensor | None  # π_prox of the decoupled loss
    advantages: Tensor
    ratio: Tensor
    clipped: Tensor
    dual_clipped: Tensor
    behave_weight: Tensor
    behave_capped: Tensor
    entropy: Tensor
    contribution: Tensor  # the token's share of its minibatch's loss
    rewards: Tensor  # [B]
    minibatch: Tensor  # [B]: which optimizer step the row took part in
    eps_clip: float
    eps_clip_higher: float | None
    behave_imp_weight_cap: float | None
    version: int  # the policy version that was updated (the engine serves version + 1 after)
    stats: dict[str, float] = field(default_factory=dict)
    # [B]: each row's group (a dense index of the step's group ids; None: the step had none). The
    # loss view marks a group whose advantages are all 0 (its rewards were equal: no signal)
    groups: Tensor | None = None
    # per row, the agent whose call it is (the `model` name it sent); set by the Session, which
    # knows the names (the trainer sees agent indices only); None: one agent, or not known
    agents: list[str | None] | None = None

    @property
    def n_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def row(self, i: int) -> dict[str, Any]:
        """Row `i` as plain lists, cut to its real (non-padding) tokens."""
        if not 0 <= i < self.n_rows:
            raise IndexError(f"row {i} out of range: the step trained {self.n_rows} rows")
        length = int(self.attention_mask[i].sum())
        out: dict[str, Any] = {
            "reward": float(self.rewards[i]),
            "minibatch": int(self.minibatch[i]),
            "agent": None if self.agents is None else self.agents[i],
        }
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else value[i, :length].tolist()
        return out

    def to(self, device: str | torch.device) -> LossInspection:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        moved: dict[str, Any] = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in values.items()}
        return LossInspection(**moved)


class InspectionCollector:
    """Assembles per-micro-batch LossTerms back into the batch's row layout."""

    def __init__(self, shape: torch.Size) -> None:
        def zeros(dtype=torch.float32):
            return torch.zeros(shape, dtype=dtype)

        self.shape = shape
        self.tensors = {name: zeros() for name in ("logprobs", "advantages", "entropy", "contribution")}
        self.tensors.update(ratio=torch.ones(shape), behave_weight=torch.ones(shape))
        self.tensors.update(
            {name: zeros(torch.bool) for name in ("clipped", "dual_clipped", "behave_capped")}
        )
        self.minibatch = torch.zeros(shape[0], dtype=torch.int64)
        self.filled = torch.zeros(shape[0], dtype=torch.bool)  # rows this collector saw

    def add(self, rows: Tensor, width: int, minibatch: int, logprobs: Tensor, terms: Any) -> None:
        rows = rows.cpu()
        self.filled[rows] = True
        self.minibatch[rows] = minibatch
        values = {
            "logprobs": logprobs,
            "advantages": terms.advantages,
            "ratio": terms.ratio,
            "clipped": terms.clipped,
            "dual_clipped": terms.dual_clipped,
            "behave_weight": terms.behave_weight,
            "behave_capped": terms.behave_capped,
            "contribution": terms.contribution,
        }
        if terms.entropy is not None:
            values["entropy"] = terms.entropy
        for name, value in values.items():
            self.tensors[name][rows, :width] = value.detach().to("cpu", self.tensors[name].dtype)

    def merge(self, other: InspectionCollector) -> None:
        """Take the rows `other` saw (data-parallel: another rank's share of the batch)."""
        rows = other.filled
        self.filled |= rows
        self.minibatch[rows] = other.minibatch[rows]
        for name, value in other.tensors.items():
            self.tensors[name][rows] = value[rows]

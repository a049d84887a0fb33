"""Before the update: the policies the loss compares π_θ with (π_prox recomputed, read from the
engine's record, or left to the training forward; π_old) and the step's advantages, with the KL
reference's log-probs where the penalty needs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from areal_nb.api import CreditMode
from areal_nb.errors import InvalidArgumentError

from .advantages import compute_advantages, kl_estimate
from .engine_numerics import engine_logprobs_are_current
from .precision import floating_dtype
from .step_batch import StepBatch

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["Policies", "policies_before_update", "reference_logprobs", "step_advantages"]


@dataclass
class Policies:
    """The log-probs the loss compares π_θ with (see `loss.py` for the three policies)."""

    old: Tensor  # π_old of the clipped ratio (π_behave in the decoupled loss)
    prox: Tensor | None  # π_prox: recomputed before the update, or filled by its forward
    recompute_skipped: bool  # the training forward fills `prox` (`recompute_is_redundant`)
    engine_as_old: bool  # π_old is the engine's record, not the recomputation
    prox_from_engine: bool = False  # `prox` is the engine's record (`engine_numerics.py`): no recomputation


def policies_before_update(actor: Actor, step: StepBatch) -> Policies:
    """π_prox (recomputed now, or left to the training forward) and the π_old of the ratio."""
    cfg = actor.cfg
    # π_old in the clipped ratio: the engine's record in decoupled mode or without
    # recomputation; otherwise the recomputed values (identical on-policy, but exact).
    engine_as_old = cfg.use_decoupled_loss or not cfg.recompute_logprob
    redundant = cfg.computes_prox_logprobs and recompute_is_redundant(actor)
    if cfg.computes_prox_logprobs and not redundant and engine_records_prox(actor, step):
        # the engine sampled with these weights in this dtype: its record is the recomputation
        # (where the training forward computes π_prox anyway, that exact value is kept instead,
        # and with it the engine-vs-trainer drift check)
        recorded = step.engine_logprobs
        return Policies(
            recorded,
            recorded,
            recompute_skipped=False,
            engine_as_old=engine_as_old,
            prox_from_engine=True,
        )
    prox = None
    skipped = redundant
    if skipped:
        # filled micro-batch by micro-batch from the training forward (pre-update weights)
        prox = torch.zeros_like(step.engine_logprobs)
    elif cfg.computes_prox_logprobs:
        prox = actor._logprobs_no_grad(actor.model, step)
    # (skipped recomputation without the decoupled loss: only the loss reads π_old, and takes
    # it from the forward; kl_ctl is 0 there, so the advantages do not read it)
    # (prox is the recomputation whenever π_old is not the engine's record)
    old = step.engine_logprobs if engine_as_old or skipped or prox is None else prox
    return Policies(old=old, prox=prox, recompute_skipped=skipped, engine_as_old=engine_as_old)


def step_advantages(
    actor: Actor, step: StepBatch, old_logprobs: Tensor, credit: CreditMode | None
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Per-token advantages (with the KL penalty's reference log-probs when `kl_ctl > 0`)."""
    cfg = actor.cfg
    ref = step.batch.ref_logprobs
    if cfg.kl_ctl > 0 and ref is None:
        ref = reference_logprobs(actor, step)
    # compute_advantages reads the batch's tensors by name (it also serves the views and the lab)
    adv = compute_advantages(
        step.batch.replace(ref_logprobs=ref).tensors() | {"old_logprobs": old_logprobs},
        cfg,
        step.group_ids,
        credit=credit,
    )
    kl_stats = {}
    if ref is not None and bool(step.mask.any()):
        # the KL estimate the penalty used, per generated token, before the kl_ctl factor
        kl = kl_estimate(old_logprobs, ref, cfg.kl_estimator)
        kl_stats["kl_ref"] = float(kl[step.mask].mean())
    return adv, kl_stats


def reference_logprobs(actor: Actor, step: StepBatch) -> Tensor:
    """The KL reference's log-probs: its own model, or (LoRA) the base with the adapters off."""
    if actor.lora:
        with actor.model.disable_adapter():
            return actor._logprobs_no_grad(actor.model, step)
    if actor.ref_model is None:
        raise InvalidArgumentError("kl_ctl > 0 needs a ref_model for the Actor or batch.ref_logprobs")
    return actor._logprobs_no_grad(actor.ref_model, step)


def engine_records_prox(actor: Actor, step: StepBatch) -> bool:
    """Whether the batch's recorded log-probs are this Actor's π_prox (`engine_numerics.py`);
    never with `skip_redundant_recompute` off (it forces the recomputation)."""
    return (
        actor.cfg.skip_redundant_recompute
        and not actor.lora  # (the engine serves base + ΔW merged: another rounding than the adapters' forward)
        and not step.allowed  # (replayed masks renormalise the recomputation)
        and engine_logprobs_are_current(
            actor.engine_numerics,
            compute_dtype=actor.compute_dtype,
            model_dtype=floating_dtype(actor.model),
            device=actor.device,
            temperature=actor.temperature,
            versions=step.batch.versions,
            mask=step.mask,
            version=actor.version,
        )
    )


def recompute_is_redundant(actor: Actor) -> bool:
    """Whether the training forward computes the recomputation's values: with one minibatch
    every micro-batch runs the weights from before the (only) optimizer step. With more, later
    minibatches run updated weights, and their π_prox must be the pre-step policy."""
    cfg = actor.cfg
    return (
        cfg.skip_redundant_recompute
        and cfg.ppo_n_minibatches == 1
        and (cfg.use_decoupled_loss or cfg.kl_ctl == 0)  # π_old feeds the KL penalty before the forward
    )

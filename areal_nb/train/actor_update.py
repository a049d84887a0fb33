"""The Actor's optimizer steps: the scheduled learning rate, then `ppo_n_minibatches` steps, each
on the gradients of the loss summed over its micro-batches (and, data-parallel, over the ranks),
clipped; the figures every rank reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .actor_forward import empty_pass, micro_batches, row_logprobs, use_adapter_of
from .actor_policies import Policies
from .distributed import DataParallel, full_state_dict
from .inspection import InspectionCollector
from .policy_loss import loss_normalizer, variant_loss_terms
from .step_batch import StepBatch, micro_allowed
from .weight_push import pause_in_place_engine

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["UpdateResult", "optimizer_steps", "set_learning_rate"]

logger = logging.getLogger(__name__)


@dataclass
class UpdateResult:
    """What the optimizer steps of one train step report."""

    collector: InspectionCollector | None
    loss_stats: list[dict[str, float]] = field(default_factory=list)  # one per micro-batch
    minibatch_losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    trained_positions: int = 0  # positions the training forward computed (padded rows: with the padding)


def set_learning_rate(actor: Actor) -> float:
    """This step's scheduled learning rate, set on the optimizer."""
    cfg = actor.cfg
    lr = cfg.lr_at(actor.steps_done)
    if lr == 0.0 and actor.steps_done == cfg.lr_decay_steps:  # warn once, on the first idle step
        logger.warning(
            "the %s learning-rate schedule reached 0 after lr_decay_steps=%d train steps: further "
            "steps do not change the weights (raise total_steps / actor.lr_decay_steps, or set "
            "actor.min_lr_ratio > 0)",
            cfg.lr_schedule,
            cfg.lr_decay_steps,
        )
    for group in actor.optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_steps(
    actor: Actor,
    step: StepBatch,
    advantages: Tensor,
    policies: Policies,
    collector: InspectionCollector | None,
) -> UpdateResult:
    """`ppo_n_minibatches` optimizer steps, each on the gradients summed over its micro-batches."""
    result = UpdateResult(collector=collector)
    minibatches = torch.arange(step.n_rows, device=step.input_ids.device).tensor_split(
        actor.cfg.ppo_n_minibatches
    )
    for minibatch, rows in enumerate(minibatches):
        actor.optimizer.zero_grad(set_to_none=True)
        result.minibatch_losses.append(
            _accumulate_gradients(actor, step, rows, minibatch, advantages, policies, result)
        )
        trained = None if step.row_agents is None else {step.row_agents[r] for r in rows.tolist()}
        result.grad_norms.append(_clip_and_step(actor, trained))
    actor.optimizer.zero_grad(set_to_none=True)
    if actor.parallel is not None:  # every rank reports the whole batch's figures
        result.loss_stats, result.minibatch_losses, result.trained_positions = _gather_step(
            actor.parallel, result.loss_stats, result.minibatch_losses, result.trained_positions, collector
        )
        if policies.recompute_skipped:
            assert policies.prox is not None
            actor.parallel.sum_(policies.prox)  # each rank filled its own rows
    return result


def _accumulate_gradients(
    actor: Actor,
    step: StepBatch,
    rows: Tensor,
    minibatch: int,
    advantages: Tensor,
    policies: Policies,
    result: UpdateResult,
) -> float:
    """Forward and backward of this process's micro-batches of `rows`; returns their loss.

    Every micro-batch divides by the minibatch's divisor (token_mean: its token count), so
    summed gradients are exactly those of the whole minibatch's loss. Data-parallel, the
    divisor is the whole minibatch's (every rank has the batch), the sum runs over ranks."""
    cfg = actor.cfg
    # algorithm hook: the aggregation's divisor (`policy_loss.loss_normalizer`)
    assert cfg.loss_agg is not None, "every preset sets loss_agg (GRPOConfig.__post_init__)"
    normalizer = loss_normalizer(step.mask, rows, cfg.loss_agg, cfg.loss_agg_constant)
    minibatch_loss = 0.0
    for micro in micro_batches(actor, rows, step):
        if not len(micro):  # FSDP: a pass of zero loss, so this rank joins the others' collectives
            empty_pass(actor, actor.model, step.input_ids, backward=True)
            continue
        cols = slice(0, int(step.attention[micro].sum(1).max()))  # right padding: drop all-pad columns
        # per-row [b, width] log-probs and entropy, packed or not: the loss sees rows. They are
        # read only on the loss mask (loss, advantages, KL, stats and inspection are masked),
        # so the packed forward runs the LM head there only.
        use_adapter_of(actor, step, micro)
        logprobs, entropy, positions = row_logprobs(
            actor,
            actor.model,
            step.input_ids[micro, cols],
            step.attention[micro, cols],
            None if step.pack_ids is None else step.pack_ids[micro],
            step.mask[micro, cols],
            micro_allowed(step, micro, cols.stop),
        )
        result.trained_positions += positions
        old = policies.old[micro, cols]
        if policies.recompute_skipped:
            assert policies.prox is not None
            policies.prox[micro, cols] = logprobs.detach()  # = what the no-grad pass returns
            if not policies.engine_as_old:
                old = policies.prox[micro, cols]
        # algorithm hook: cfg's ratio, objective and mismatch correction (`policy_loss.py`;
        # algorithm grpo: token ratio, PPO objective, no correction)
        terms, _ = variant_loss_terms(
            cfg,
            logprobs,
            old,
            advantages[micro, cols],
            step.mask[micro, cols],
            None if policies.prox is None else policies.prox[micro, cols],
            step.engine_logprobs[micro, cols],
            entropy,
            normalizer if isinstance(normalizer, int) else normalizer[micro, cols],
        )
        if result.collector is not None:
            result.collector.add(micro, cols.stop, minibatch, logprobs, terms)
        (terms.loss if actor.grad_scaler is None else actor.grad_scaler.scale(terms.loss)).backward()
        minibatch_loss += float(terms.loss.detach())
        result.loss_stats.append(terms.stats)
    return minibatch_loss


def _clip_and_step(actor: Actor, trained_agents: set[str] | None = None) -> float:
    """Sum the ranks' gradients (DDP), clip them, take one optimizer step; the gradient norm
    (agent adapters: each adapter clipped on its own, the norm over all of them; an agent
    with no row in the minibatch, `trained_agents`, takes no step, as in one process)."""
    if actor.parallel is not None and not actor.sharded:  # (FSDP has reduce-scattered them)
        actor.parallel.all_reduce_grads(actor.params)
        for agent, params in actor.agent_params.items():
            if trained_agents is not None and agent not in trained_agents:
                for p in params:  # (the all-reduce gave it zeros, which AdamW's momentum would step)
                    p.grad = None
    if actor.grad_scaler is not None:
        actor.grad_scaler.unscale_(actor.optimizer)
    max_norm = actor.cfg.max_grad_norm if actor.cfg.max_grad_norm > 0 else float("inf")
    if actor.agents:
        norms = [torch.nn.utils.clip_grad_norm_(params, max_norm) for params in actor.agent_params.values()]
        norm = torch.stack(norms).norm()
    else:
        norm = torch.nn.utils.clip_grad_norm_(actor.params, max_norm)  # (FSDP: a DTensor, the global norm)
    pause_in_place_engine(actor)  # the step writes the parameters the engine reads
    if actor.grad_scaler is None:
        actor.optimizer.step()
    else:
        actor.grad_scaler.step(actor.optimizer)
        actor.grad_scaler.update()
    return float(full_state_dict(norm))


def _gather_step(
    parallel: DataParallel,
    loss_stats: list[dict[str, float]],
    minibatch_losses: list[float],
    positions: int,
    collector: InspectionCollector | None,
) -> tuple[list[dict[str, float]], list[float], int]:
    """The whole step's figures from every rank's share: micro-batch stats, minibatch losses
    (each rank's is a part of the same token mean: they add up), computed positions, inspection."""
    shares = parallel.all_gather((loss_stats, minibatch_losses, positions, collector))
    all_stats = [s for share in shares for s in share[0]]
    losses = [sum(share[1][i] for share in shares) for i in range(len(minibatch_losses))]
    if collector is not None:
        for share in shares:
            collector.merge(share[3])
    return all_stats, losses, sum(share[2] for share in shares)

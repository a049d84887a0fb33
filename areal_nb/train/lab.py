"""The algorithm lab: one captured batch under several algorithm variants, nothing stepped.

`compare_variants(actor, batch, configs)` runs the policy's forward once, with gradients, at the
actor's current weights, then for every variant (a `GRPOConfig`) computes what its train step
would: the advantages, the loss (`policy_loss.variant_loss_terms`, the same call the actor
makes), its per-token decisions (clipped, masked), the gradient of the loss w.r.t. every
parameter, and the per-token weight −∂loss/∂log π_θ(y_t) (how hard the update pushes the token up,
> 0, or down, < 0). The gradients come from `torch.autograd.grad`, so the parameters' `.grad`, the
weights, the optimizer state and the RNG states are left as they were (the RNG states are saved
and restored around the forward anyway).

It is the update of a one-minibatch train step (`ppo_n_minibatches: 1`; with more, later
minibatches run on weights the earlier ones moved): π_prox is the forward's own log-probs, as in
the trainer's skipped recomputation. `trial_step=True` also applies each variant's update (its
gradient, clipped at `max_grad_norm`, one AdamW step from a copy of the optimizer's state) to a
copy of the model and reports the KL it causes on the batch's tokens.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

from .actor_forward import row_logprobs
from .advantages import compute_advantages, group_index
from .mismatch import mismatch_report
from .policy_loss import loss_normalizer, variant_loss_terms


@dataclass
class VariantResult:
    """One variant's train step on the batch, without the step. Tensors are `[B, L]`, on the CPU."""

    name: str
    cfg: Any  # its GRPOConfig
    loss: float
    stats: dict[str, float]
    advantages: Tensor
    token_weight: Tensor  # −∂loss/∂log π_θ(y_t): the push on each token (0 off the mask)
    clipped: Tensor  # bool: the objective's clip bounded the token (PPO clip, dual clip, CISPO's weight)
    masked: Tensor  # bool: dropped from the loss (behaviour-weight cap, MIS)
    mismatch_weight: Tensor  # the TIS / MIS factor (1 without a correction)
    grad_norm: float
    grad: Tensor = field(repr=False)  # the flattened gradient (device of the model)
    trial_kl: float | None = None  # with trial_step: KL(π_before ‖ π_after) on the batch's tokens (k3)


def compare_variants(
    actor: Any,
    batch: TrainBatch,
    configs: Mapping[str, Any],
    credit: str | None = None,
    trial_step: bool = False,
) -> list[VariantResult]:
    """Each of `configs` (name → GRPOConfig) on `batch` (the trainer's `TrainBatch`, its
    `group_ids` the groups) at `actor`'s weights."""
    if not isinstance(batch, TrainBatch):
        raise ArgumentTypeError(f"compare_variants takes a TrainBatch, got {type(batch).__name__}")
    if not configs:
        raise InvalidArgumentError("compare needs at least one variant, e.g. {'grpo': {}, 'dr_grpo': {}}")
    if getattr(actor, "parallel", None) is not None:
        raise InvalidArgumentError(
            "the lab runs in one process; under torchrun compare on rank 0 of a one-process Session"
        )
    rng = _rng_state()
    try:
        return _compare(actor, batch.to(actor.device), configs, credit, trial_step)
    finally:
        _restore_rng(rng)


# One forward shared by every variant: the graph of `logprobs` is kept across the loop (each variant
# differentiates through it) and freed at its end, so the loop and its inputs stay one function.
def _compare(
    actor: Any, batch: TrainBatch, configs: Mapping[str, Any], credit: str | None, trial_step: bool
) -> list[VariantResult]:
    model = actor.model
    input_ids, attention = batch.input_ids, batch.attention_mask
    mask = batch.loss_mask.bool() & attention
    engine = batch.logprobs.float()
    group_ids = batch.group_ids
    pack_ids = (
        group_index(group_ids, input_ids.shape[0]).to(input_ids.device) if group_ids is not None else None
    )
    width = int(attention.sum(1).max())
    cols = slice(0, width)
    logprobs, entropy, _ = row_logprobs(
        actor, model, input_ids[:, cols], attention[:, cols], pack_ids, mask[:, cols]
    )
    prox = logprobs.detach()
    params = actor.params
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    ref = batch.ref_logprobs
    if any(cfg.kl_ctl > 0 for cfg in configs.values()) and ref is None:
        ref = _reference_logprobs(actor, batch, pack_ids, mask, cols)
    results = []
    for name, cfg in configs.items():
        old = engine[:, cols] if cfg.use_decoupled_loss or not cfg.recompute_logprob else prox
        full_old = torch.zeros_like(engine)
        full_old[:, cols] = old
        adv_inputs = batch.replace(ref_logprobs=ref).tensors() | {"old_logprobs": full_old}
        advantages = compute_advantages(adv_inputs, cfg, group_ids, credit=credit)["advantages"][:, cols]
        normalizer = loss_normalizer(mask, rows, cfg.loss_agg, cfg.loss_agg_constant)
        terms, mismatch = variant_loss_terms(
            cfg,
            logprobs,
            old,
            advantages,
            mask[:, cols],
            prox,
            engine[:, cols],
            entropy,
            normalizer if isinstance(normalizer, int) else normalizer[:, cols],
        )
        grads = torch.autograd.grad(terms.loss, [logprobs, *params], retain_graph=True, allow_unused=True)
        flat = _flat_gradient(params, grads[1:])
        stats = {**terms.stats, **mismatch_report(cfg, prox, engine[:, cols], mask[:, cols])}
        masked = terms.behave_capped | (
            mismatch.masked if mismatch is not None else torch.zeros_like(terms.clipped)
        )
        results.append(
            VariantResult(
                name=name,
                cfg=cfg,
                loss=float(terms.loss.detach()),
                stats=stats,
                advantages=_full(terms.advantages, engine),
                token_weight=_full(-grads[0].float(), engine),
                clipped=_full(terms.clipped | terms.dual_clipped, mask),
                masked=_full(masked, mask),
                mismatch_weight=_full(
                    torch.ones_like(prox) if mismatch is None else mismatch.weight, engine, fill=1.0
                ),
                grad_norm=float(flat.norm()),
                grad=flat,
            )
        )
    del logprobs, entropy  # the graph
    if trial_step:
        for result in results:
            result.trial_kl = _trial_kl(
                actor, result, input_ids[:, cols], attention[:, cols], pack_ids, mask[:, cols], prox
            )
    return results


def _reference_logprobs(
    actor: Any, batch: TrainBatch, pack_ids: Tensor | None, mask: Tensor, cols: slice
) -> Tensor:
    """The reference model's log-probs of the batch, for variants with kl_ctl > 0."""
    if actor.ref_model is None:
        raise InvalidArgumentError(
            "a variant has kl_ctl > 0: the Session needs a reference model (its own actor.kl_ctl > 0)"
        )
    input_ids, attention = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        ref = torch.zeros_like(batch.logprobs.float())
        ref[:, cols] = row_logprobs(
            actor, actor.ref_model, input_ids[:, cols], attention[:, cols], pack_ids, mask[:, cols]
        )[0]
    return ref


def _flat_gradient(params: list[Tensor], grads: Sequence[Tensor | None]) -> Tensor:
    """The gradients of `params` as one float vector (zeros for a parameter the loss does not reach)."""
    return torch.cat(
        [
            (torch.zeros_like(p) if g is None else g).flatten().float()
            for p, g in zip(params, grads, strict=True)
        ]
    )


def _full(values: Tensor, like: Tensor, fill: float = 0.0) -> Tensor:
    """`[B, width]` values back to the batch's `[B, L]`, on the CPU."""
    out = torch.full(like.shape, fill, dtype=values.dtype, device=values.device)
    out[:, : values.shape[1]] = values.detach()
    return out.cpu()


def _trial_kl(actor, result: VariantResult, input_ids, attention, pack_ids, mask, before: Tensor) -> float:
    """Apply the variant's update to a copy of the model (one AdamW step from a copy of the
    optimizer state) and return mean k3 of KL(π_before ‖ π_after) over the batch's loss tokens."""
    cfg = result.cfg
    model = copy.deepcopy(actor.model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr_at(actor.steps_done),
        betas=cfg.betas,
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )
    state = copy.deepcopy(actor.optimizer.state_dict())  # (load_state_dict may keep the tensors it is given)
    for group in state["param_groups"]:
        group.update(
            lr=cfg.lr_at(actor.steps_done), betas=cfg.betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
    optimizer.load_state_dict(state)
    offset = 0
    for p in params:
        p.grad = result.grad[offset : offset + p.numel()].view_as(p).to(p.dtype).clone()
        offset += p.numel()
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    optimizer.step()
    with torch.no_grad():
        after = row_logprobs(actor, model, input_ids, attention, pack_ids, mask)[0]
    log_ratio = (after - before)[mask]
    return float((torch.expm1(log_ratio) - log_ratio).mean()) if log_ratio.numel() else 0.0


def cosine_matrix(results: Sequence[VariantResult]) -> Tensor:
    """Cosine similarity of every pair of the variants' gradients (0 where a gradient is 0)."""
    grads = torch.stack([r.grad for r in results]).double()
    norms = grads.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, grads / norms.clamp(min=1e-30), torch.zeros_like(grads))
    return (unit @ unit.T).cpu()


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])

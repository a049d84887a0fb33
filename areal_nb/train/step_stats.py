"""What a train step reports: its stats (losses, gradient norms, rewards and advantages, the
micro-batches' loss stats, staleness, engine-vs-trainer drift) and, on request, its per-token
`LossInspection`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from areal_nb.api.train_batch import TrainBatch

from .actor_policies import Policies
from .actor_update import UpdateResult
from .inspection import InspectionCollector, LossInspection
from .mismatch import mismatch_report
from .step_batch import StepBatch

if TYPE_CHECKING:
    from .actor import Actor

__all__ = ["loss_inspection", "step_stats"]


def step_stats(
    actor: Actor,
    step: StepBatch,
    adv: dict[str, Tensor],
    update: UpdateResult,
    policies: Policies,
    kl_stats: dict[str, float],
    lr: float,
    elapsed: float,
) -> dict[str, float]:
    cfg = actor.cfg
    mask = step.mask
    out = {
        "loss": sum(update.minibatch_losses) / len(update.minibatch_losses),
        "grad_norm": sum(update.grad_norms) / len(update.grad_norms),
        **_reward_and_advantage_stats(step.batch.rewards, adv["scores"], adv["advantages"], mask),
        **_aggregate(update.loss_stats),
        **_staleness(actor, step.batch.versions, mask),
        **kl_stats,
        "n_tokens": float(mask.sum()),
        "n_rows": float(step.n_rows),
        "train_seconds": elapsed,
        # all non-padding tokens of the rows are trained on, prompt included
        "train_tokens_per_s": float(step.attention.sum()) / elapsed if elapsed > 0 else 0.0,
        "train_positions": float(update.trained_positions),  # < row tokens when prefixes are shared
        "recompute_skipped": float(policies.recompute_skipped),
        "prox_from_engine": float(policies.prox_from_engine),
    }
    if policies.prox is not None and not policies.prox_from_engine and bool(mask.any()):
        diff = (policies.prox - step.engine_logprobs).abs()[mask]
        out["logprob_abs_diff_mean"] = float(diff.mean())  # engine vs trainer, same weights?
        out["logprob_abs_diff_max"] = float(diff.max())
        out.update(mismatch_report(cfg, policies.prox, step.engine_logprobs, mask))  # algorithm hook
    out["version"] = float(actor.version)
    out["lr"] = lr
    return out


def loss_inspection(
    actor: Actor,
    collector: InspectionCollector,
    batch: TrainBatch,
    mask: Tensor,
    old_logprobs: Tensor,
    prox_logprobs: Tensor | None,
    stats: dict[str, float],
) -> LossInspection:
    cfg = actor.cfg
    assert cfg.eps_clip is not None, "every preset sets eps_clip (GRPOConfig.__post_init__)"
    turn_ids = batch.turn_ids
    return LossInspection(
        input_ids=batch.input_ids.cpu(),
        attention_mask=batch.attention_mask.cpu(),
        loss_mask=mask.cpu(),
        turn_ids=None if turn_ids is None else turn_ids.cpu(),
        old_logprobs=old_logprobs.float().cpu(),
        prox_logprobs=None if prox_logprobs is None else prox_logprobs.cpu(),
        rewards=batch.rewards.float().cpu(),
        minibatch=collector.minibatch,
        eps_clip=cfg.eps_clip,
        eps_clip_higher=cfg.eps_clip_higher,
        behave_imp_weight_cap=cfg.behave_imp_weight_cap if cfg.use_decoupled_loss else None,
        version=actor.version,
        stats=dict(stats),
        **collector.tensors,
    )


def _staleness(actor: Actor, versions: Tensor | None, mask: Tensor) -> dict[str, float]:
    """How many versions behind the trained weights each generated token was sampled."""
    if versions is None:
        return {}
    sampled = mask & (versions >= 0)
    if not bool(sampled.any()):
        return {"staleness_mean": 0.0, "staleness_max": 0.0}
    lag = (actor.version - versions[sampled]).float()
    return {"staleness_mean": float(lag.mean()), "staleness_max": float(lag.max())}


def _reward_and_advantage_stats(
    rewards: Tensor, scores: Tensor, advantages: Tensor, mask: Tensor
) -> dict[str, float]:
    rewards = rewards.float()
    stats = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),  # population std: defined for one row
        "score_mean": float(scores.mean()),
    }
    if bool(mask.any()):
        selected = advantages[mask]
        stats.update(
            adv_mean=float(selected.mean()),
            adv_std=float(selected.std(correction=0)),
            adv_min=float(selected.min()),
            adv_max=float(selected.max()),
        )
    return stats


def _aggregate(per_micro: list[dict[str, float]]) -> dict[str, float]:
    """Token-weighted means across micro-batches; `_min`/`_max` keys take the extreme."""
    used = [s for s in per_micro if s["n_tokens"] > 0]
    if not used:
        return {}
    total = sum(s["n_tokens"] for s in used)
    out: dict[str, float] = {}
    for key in used[0]:
        if key == "n_tokens":
            continue
        values = [s[key] for s in used]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = sum(v * s["n_tokens"] for v, s in zip(values, used, strict=True)) / total
    return out

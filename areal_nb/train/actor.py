"""`Actor`: one GRPO training step on a captured batch, then weight sync to the engine.

Batch format (the capture layer's `concat_padded_tensors`, right padding):
  input_ids [B,L] int64, attention_mask [B,L] bool, loss_mask [B,L] (1 on generated tokens),
  logprobs [B,L] float32 (engine log-prob at each generated token's position, 0 elsewhere),
  versions [B,L] int64 (policy version that sampled the token, -1 elsewhere), rewards [B];
  optional ref_logprobs [B,L], group_ids [B]; for `credit="turn"` turn_returns [B,L] float32
  and turn_ids [B,L] int64.

Usage (what `Session.train_step` does):
    actor = Actor(model, GRPOConfig(), version=engine.get_version())
    stats = actor.train_step(batch, group_ids)   # actor.version += 1
    actor.push_weights(engine)                   # engine now samples with actor.version

Data-parallel (`parallel=DataParallel`, see `distributed.py`): every rank calls `train_step` with
the same whole batch; each computes its share of the rows, the gradients are summed over the
ranks, and the update equals the one-process update on the whole batch. With
`cfg.parallel == "fsdp"` the model and the KL reference are sharded (FSDP2) and `weights()` /
`state_dict()` / `ref_weights()` gather the full tensors: collectives that every rank calls (see
`distributed.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_nb.api import CreditMode, InferenceEngine

from .advantages import compute_advantages, group_index, kl_estimate
from .config import GRPOConfig
from .distributed import DataParallel, full_state_dict, fully_shard_model, shard_like
from .inspection import InspectionCollector, LossInspection
from .logprobs import compute_token_logprobs_and_entropy
from .mismatch import mismatch_report
from .packing import pack_rows, packed_token_logprobs_and_entropy
from .policy_loss import loss_normalizer, variant_loss_terms
from .tree_attention import supports_tree_attention

__all__ = ["Actor", "GRPOConfig"]

logger = logging.getLogger(__name__)

REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")


class Actor:
    """Owns the trainable model, its AdamW optimizer and its policy version."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: GRPOConfig | None = None,
        ref_model: torch.nn.Module | None = None,
        version: int = 0,
        parallel: DataParallel | None = None,
    ) -> None:
        self.model = model
        self.parallel = parallel  # None: one process trains on the whole batch
        self.cfg = cfg or GRPOConfig()
        self.ref_model = ref_model
        self.version = version
        self.steps_done = 0  # train steps taken; drives the learning-rate schedule
        self.last_inspection: LossInspection | None = None  # set by train_step(inspect=True)
        # Dropout would make π_θ differ from the policy that sampled (ratios ≠ 1 on-policy).
        self.model.eval()
        # FSDP2 (data-parallel only): parameters, gradients and Adam state sharded over the ranks
        self.sharded = parallel is not None and self.cfg.parallel == "fsdp"
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        if self.sharded:
            fully_shard_model(model)
            if ref_model is not None:  # the KL reference follows: 1/N of it per rank, no grads, no optimizer
                fully_shard_model(ref_model, frozen=True)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.cfg.lr,
            betas=self.cfg.betas,
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------- one step
    def train_step(
        self, batch: dict[str, Any], group_ids: Tensor | Sequence[Any] | None = None, credit: CreditMode | None = None,
        inspect: bool = False,
    ) -> dict[str, float]:
        """Recompute log-probs, compute advantages, run `ppo_n_minibatches` optimizer steps.

        With `cfg.pack` the rows of one group (`group_ids`, else `batch["group_ids"]`; without
        either, each micro-batch) are merged into a token trie so shared prefixes are computed
        once; the per-row log-probs equal the padded computation (see `packing.py`).
        The no-grad recomputation of π_prox (π_old without the decoupled loss) is skipped when
        the training forward computes the same values (`cfg.skip_redundant_recompute`, one
        minibatch: the forward runs the pre-update weights); its detached log-probs are used
        instead and stats hold `recompute_skipped = 1`.

        `credit` ("leaf" | "turn") overrides `cfg.credit` for this step (a RolloutBatch's own
        setting). `inspect=True` keeps the update's per-token values in `self.last_inspection`
        (a `LossInspection`). Returns the step's stats; afterwards `self.version` is one higher.
        """
        start = time.perf_counter()
        cfg = self.cfg
        batch = _validated(batch, self.device)
        input_ids, attention = batch["input_ids"], batch["attention_mask"]
        mask = batch["loss_mask"].bool() & attention
        engine_logprobs = batch["logprobs"].float()
        n_rows = input_ids.shape[0]
        if n_rows < cfg.ppo_n_minibatches:
            raise ValueError(f"batch has {n_rows} rows, fewer than ppo_n_minibatches={cfg.ppo_n_minibatches}")

        lr = cfg.lr_at(self.steps_done)
        if lr == 0.0 and self.steps_done == cfg.lr_decay_steps:  # warn once, on the first idle step
            logger.warning(
                "the %s learning-rate schedule reached 0 after lr_decay_steps=%d train steps: further "
                "steps do not change the weights (raise total_steps / actor.lr_decay_steps, or set "
                "actor.min_lr_ratio > 0)", cfg.lr_schedule, cfg.lr_decay_steps,
            )
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        if group_ids is None:
            group_ids = batch.get("group_ids")
        pack_ids = group_index(group_ids, n_rows).to(input_ids.device) if group_ids is not None else None
        lengths = attention.sum(1)
        parallel = self.parallel

        def own(rows: Tensor) -> list[Tensor]:
            """The micro-batches of `rows` this process computes (all rows without data
            parallelism); through the sharded model, as many as every other rank (some empty)."""
            if parallel is None:
                return list(rows.split(cfg.micro_batch_size or max(len(rows), 1))) if len(rows) else []
            same_count = self.sharded  # (the policy and the reference alike)
            return parallel.micro_batches(rows, lengths, cfg.micro_batch_size, same_count=same_count,
                                          pack_ids=pack_ids if same_count and cfg.pack else None)

        prox_logprobs = None
        recompute_skipped = cfg.computes_prox_logprobs and self._recompute_is_redundant()
        if recompute_skipped:
            # filled micro-batch by micro-batch from the training forward (pre-update weights)
            prox_logprobs = torch.zeros_like(engine_logprobs)
        elif cfg.computes_prox_logprobs:
            prox_logprobs = self._logprobs_no_grad(self.model, input_ids, attention, pack_ids, own, mask)
        # π_old in the clipped ratio: the engine's record in decoupled mode or without
        # recomputation; otherwise the recomputed values (identical on-policy, but exact).
        use_engine_as_old = cfg.use_decoupled_loss or not cfg.recompute_logprob
        # (skipped recomputation without the decoupled loss: only the loss below reads π_old, and
        # takes it from the forward; kl_ctl is 0 there, so the advantages do not read it)
        old_logprobs = engine_logprobs if use_engine_as_old or recompute_skipped else prox_logprobs

        adv_inputs = dict(batch, old_logprobs=old_logprobs)
        if cfg.kl_ctl > 0 and "ref_logprobs" not in batch:
            if self.ref_model is None:
                raise ValueError("kl_ctl > 0 needs a ref_model for the Actor or batch['ref_logprobs']")
            adv_inputs["ref_logprobs"] = self._logprobs_no_grad(
                self.ref_model, input_ids, attention, pack_ids, own, mask)
        adv = compute_advantages(adv_inputs, cfg, group_ids, credit=credit)
        kl_stats = {}
        if "ref_logprobs" in adv_inputs and bool(mask.any()):
            # the KL estimate the penalty used, per generated token, before the kl_ctl factor
            kl = kl_estimate(old_logprobs, adv_inputs["ref_logprobs"], cfg.kl_estimator)
            kl_stats["kl_ref"] = float(kl[mask].mean())
        advantages = adv["advantages"]

        loss_stats: list[dict[str, float]] = []
        trained_positions = 0  # positions the training forward computed (padded rows: with the padding)
        minibatch_losses, grad_norms = [], []
        collector = InspectionCollector(input_ids.shape) if inspect else None
        minibatches = torch.arange(n_rows, device=input_ids.device).tensor_split(cfg.ppo_n_minibatches)
        for minibatch, rows in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            # Every micro-batch divides by the minibatch's divisor (token_mean: its token count),
            # so summed gradients are exactly those of the whole minibatch's loss. Data-parallel,
            # the divisor is the whole minibatch's (every rank has the batch), the sum runs over ranks.
            # algorithm hook: the aggregation's divisor (`policy_loss.loss_normalizer`)
            normalizer = loss_normalizer(mask, rows, cfg.loss_agg, cfg.loss_agg_constant)
            minibatch_loss = 0.0
            for micro in own(rows):
                if not len(micro):  # FSDP: a pass of zero loss, so this rank joins the others' collectives
                    self._empty_pass(self.model, input_ids, backward=True)
                    continue
                width = int(attention[micro].sum(1).max())  # right padding: drop all-pad columns
                cols = slice(0, width)
                # per-row [b, width] log-probs and entropy, packed or not: the loss sees rows. They
                # are read only on the loss mask (loss, advantages, KL, stats and inspection are
                # masked), so the packed forward runs the LM head there only (here and above).
                logprobs, entropy, positions = self._row_logprobs(
                    self.model, input_ids[micro, cols], attention[micro, cols],
                    None if pack_ids is None else pack_ids[micro], mask[micro, cols],
                )
                trained_positions += positions
                micro_old = old_logprobs[micro, cols]
                if recompute_skipped:
                    assert prox_logprobs is not None
                    prox_logprobs[micro, cols] = logprobs.detach()  # = what the no-grad pass returns
                    if not use_engine_as_old:
                        micro_old = prox_logprobs[micro, cols]
                # algorithm hook: cfg's ratio, objective and mismatch correction (`policy_loss.py`;
                # algorithm grpo runs `loss.ppo_loss_terms` as it always did)
                terms, _ = variant_loss_terms(
                    cfg, logprobs, micro_old, advantages[micro, cols], mask[micro, cols],
                    None if prox_logprobs is None else prox_logprobs[micro, cols], engine_logprobs[micro, cols],
                    entropy, normalizer if isinstance(normalizer, int) else normalizer[micro, cols],
                )
                loss, stats = terms.loss, terms.stats
                if collector is not None:
                    collector.add(micro, width, minibatch, logprobs, terms)
                loss.backward()
                minibatch_loss += float(loss.detach())
                loss_stats.append(stats)
            if parallel is not None and not self.sharded:  # (FSDP has reduce-scattered them)
                parallel.all_reduce_grads(self.params)
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # (FSDP: a DTensor, the global norm)
            grad_norms.append(float(full_state_dict(norm)))
            self.optimizer.step()
            minibatch_losses.append(minibatch_loss)
        self.optimizer.zero_grad(set_to_none=True)
        if parallel is not None:  # every rank reports the whole batch's figures
            loss_stats, minibatch_losses, trained_positions = _gather_step(
                parallel, loss_stats, minibatch_losses, trained_positions, collector)
            if recompute_skipped:
                assert prox_logprobs is not None
                parallel.sum_(prox_logprobs)  # each rank filled its own rows

        elapsed = time.perf_counter() - start
        out = {
            "loss": sum(minibatch_losses) / len(minibatch_losses),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            **_reward_and_advantage_stats(batch["rewards"], adv["scores"], advantages, mask),
            **_aggregate(loss_stats),
            **self._staleness(batch.get("versions"), mask),
            **kl_stats,
            "n_tokens": float(mask.sum()),
            "n_rows": float(n_rows),
            "train_seconds": elapsed,
            # all non-padding tokens of the rows are trained on, prompt included
            "train_tokens_per_s": float(attention.sum()) / elapsed if elapsed > 0 else 0.0,
            "train_positions": float(trained_positions),  # < row tokens when prefixes are shared
            "recompute_skipped": float(recompute_skipped),
        }
        if prox_logprobs is not None and bool(mask.any()):
            diff = (prox_logprobs - engine_logprobs).abs()[mask]
            out["logprob_abs_diff_mean"] = float(diff.mean())  # engine vs trainer, same weights?
            out["logprob_abs_diff_max"] = float(diff.max())
            out.update(mismatch_report(cfg, prox_logprobs, engine_logprobs, mask))  # algorithm hook
        out["version"] = float(self.version)
        out["lr"] = lr
        if collector is not None:
            self.last_inspection = self._inspection(collector, batch, mask, old_logprobs, prox_logprobs, out)
        self.version += 1
        self.steps_done += 1
        return out

    def _recompute_is_redundant(self) -> bool:
        """Whether the training forward computes the recomputation's values: with one minibatch
        every micro-batch runs the weights from before the (only) optimizer step. With more, later
        minibatches run updated weights, and their π_prox must be the pre-step policy."""
        cfg = self.cfg
        return (
            cfg.skip_redundant_recompute
            and cfg.ppo_n_minibatches == 1
            and (cfg.use_decoupled_loss or cfg.kl_ctl == 0)  # π_old feeds the KL penalty before the forward
        )

    def _row_logprobs(
        self, model: torch.nn.Module, input_ids: Tensor, attention: Tensor, pack_ids: Tensor | None,
        needed: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, int]:
        """Token log-probs and entropy `[b, width]` of right-padded rows, through one trie per pack
        id (`cfg.pack`) or the padded rows, and the number of positions the model computed. With
        `needed` (bool `[b, width]`) the packed forward may leave the other positions at 0."""
        if self.cfg.pack:
            flat = self.cfg.tree_attention and supports_tree_attention(model)
            packed = pack_rows(input_ids, attention, pack_ids, flat=flat)
            logprobs, entropy = packed_token_logprobs_and_entropy(
                model, packed, self.cfg.temperature, positions=needed,
                last_layer_at_heads=self.cfg.last_layer_at_heads)
            assert entropy is not None
            return logprobs, entropy, packed.n_nodes
        logprobs, entropy = compute_token_logprobs_and_entropy(model, input_ids, attention, self.cfg.temperature)
        return logprobs, entropy, input_ids.numel()

    def _inspection(self, collector: InspectionCollector, batch: dict[str, Any], mask: Tensor, old_logprobs: Tensor,
                    prox_logprobs: Tensor | None, stats: dict[str, float]) -> LossInspection:
        cfg = self.cfg
        turn_ids = batch.get("turn_ids")
        return LossInspection(
            input_ids=batch["input_ids"].cpu(), attention_mask=batch["attention_mask"].cpu(), loss_mask=mask.cpu(),
            turn_ids=None if turn_ids is None else turn_ids.cpu(), old_logprobs=old_logprobs.float().cpu(),
            prox_logprobs=None if prox_logprobs is None else prox_logprobs.cpu(),
            rewards=batch["rewards"].float().cpu(), minibatch=collector.minibatch, eps_clip=cfg.eps_clip,
            eps_clip_higher=cfg.eps_clip_higher,
            behave_imp_weight_cap=cfg.behave_imp_weight_cap if cfg.use_decoupled_loss else None,
            version=self.version, stats=dict(stats), **collector.tensors,
        )

    @torch.no_grad()
    def _logprobs_no_grad(
        self, model: torch.nn.Module, input_ids: Tensor, attention: Tensor, pack_ids: Tensor | None, own: Any,
        needed: Tensor | None = None,
    ) -> Tensor:
        """Log-probs of every row (with `needed`: at least there); data-parallel, each rank
        computes its micro-batches `own(rows)` and the ranks sum their (otherwise zero) rows."""
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        for micro in own(rows):
            if not len(micro):
                self._empty_pass(model, input_ids, backward=False)
                continue
            width = int(attention[micro].sum(1).max())
            out[micro, :width] = self._row_logprobs(
                model, input_ids[micro, :width], attention[micro, :width], None if pack_ids is None else pack_ids[micro],
                None if needed is None else needed[micro, :width],
            )[0]
        if self.parallel is not None:
            self.parallel.sum_(out)
        return out

    def _empty_pass(self, model: torch.nn.Module, input_ids: Tensor, backward: bool) -> None:
        """A forward (and backward) of one token with zero loss: under FSDP every rank must run
        the same number of passes (each gathers and reduce-scatters with the others)."""
        logits = model(input_ids=input_ids[:1, :1], use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    def _staleness(self, versions: Tensor | None, mask: Tensor) -> dict[str, float]:
        """How many versions behind the trained weights each generated token was sampled."""
        if versions is None:
            return {}
        sampled = mask & (versions >= 0)
        if not bool(sampled.any()):
            return {"staleness_mean": 0.0, "staleness_max": 0.0}
        lag = (self.version - versions[sampled]).float()
        return {"staleness_mean": float(lag.mean()), "staleness_max": float(lag.max())}

    # ---------------------------------------------------------------- weights
    def push_weights(self, engine: InferenceEngine, version: int | None = None) -> int:
        """Send the current weights to the engine; tokens sampled afterwards carry `version`.

        The engine must copy the tensors (they are the live parameters, which the next step
        changes in place).
        """
        version = self.version if version is None else version
        weights = self.weights()
        if engine is not None:
            engine.update_weights(weights, version=version)
        return version

    def weights(self) -> dict[str, Tensor]:
        """The model's full weights by name. Sharded (FSDP) a gather that every rank calls."""
        return full_state_dict(self.model.state_dict()) if self.sharded else self.model.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Full weights and optimizer state (sharded: gathered, on every rank that calls it)."""
        optimizer = self.optimizer.state_dict()
        return {
            "model": self.weights(),
            "optimizer": full_state_dict(optimizer) if self.sharded else optimizer,
            "version": self.version,
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s full tensors; sharded, each rank keeps its own shards (no
        communication)."""
        self.model.load_state_dict(shard_like(state["model"], self.model.state_dict()) if self.sharded
                                   else state["model"])
        self.load_optimizer_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.steps_done = int(state.get("steps_done", 0))

    def ref_weights(self) -> dict[str, Tensor] | None:
        """The KL reference's full weights (None without one). Sharded: a gather every rank calls."""
        if self.ref_model is None:
            return None
        state = self.ref_model.state_dict()
        return full_state_dict(state) if self.sharded else state

    def load_ref_weights(self, state: dict[str, Tensor]) -> None:
        """Restore `ref_weights()`'s full tensors; sharded, each rank keeps its own shards (no
        communication)."""
        if self.ref_model is None:
            raise ValueError("this Actor has no reference model (actor.kl_ctl is 0)")
        self.ref_model.load_state_dict(shard_like(state, self.ref_model.state_dict()) if self.sharded else state)

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's full state (a checkpoint's, or rank 0's), cut to this rank's shards."""
        if self.sharded:  # Adam's moments are shaped like their parameters: shard them alike
            state = {**state, "state": {i: {k: shard_like(v, self.params[i]) if _shaped_like(v, self.params[i]) else v
                                            for k, v in moments.items()} for i, moments in state["state"].items()}}
        self.optimizer.load_state_dict(state)


def _shaped_like(value: Any, param: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == param.shape


def _gather_step(
    parallel: DataParallel, loss_stats: list[dict[str, float]], minibatch_losses: list[float], positions: int,
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


def _validated(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"training batch lacks {missing}; expected keys {list(REQUIRED_KEYS)} (+ versions)")
    out = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    shape = out["input_ids"].shape
    for key in ("attention_mask", "loss_mask", "logprobs", "versions", "ref_logprobs", "turn_ids", "turn_returns"):
        if key in out and out[key].shape != shape:
            raise ValueError(f"batch[{key!r}] has shape {tuple(out[key].shape)}, input_ids {tuple(shape)}")
    if out["rewards"].numel() != shape[0]:
        raise ValueError(f"batch['rewards'] has {out['rewards'].numel()} entries for {shape[0]} rows")
    attention = out["attention_mask"].bool()
    lengths = attention.sum(1, keepdim=True)
    if not torch.equal(attention, torch.arange(shape[1], device=device) < lengths):
        raise ValueError("attention_mask must be right-padded: each row is ones then zeros")
    out["attention_mask"] = attention
    return out


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

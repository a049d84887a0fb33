"""`Actor`: one GRPO training step on a captured batch, then weight sync to the engine.

The step takes a `TrainBatch` (`areal_nb.api.train_batch`: right-padded `[B, L]` tensors and
`[B]` row metadata, checked when it is made), as `RolloutBatch.to_tensors()` builds it; its
`group_ids` name the groups of the advantages' baselines and of the prefix packing.

Usage (what `Session.train_step` does):
    actor = Actor(model, GRPOConfig(), version=engine.get_version())
    stats = actor.train_step(rollout_batch.to_tensors())   # actor.version += 1
    actor.push_weights(engine)                             # engine now samples with actor.version

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
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from areal_nb.api import AgentWeights, CreditMode, InferenceEngine
from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError, TrainBatchError

from .advantages import compute_advantages, group_index, kl_estimate
from .config import GRPOConfig
from .distributed import DataParallel, full_state_dict, fully_shard_model, shard_like
from .engine_numerics import EngineNumerics, engine_logprobs_are_current
from .heap import release_freed_memory
from .inspection import InspectionCollector, LossInspection
from .logprobs import compute_token_logprobs_and_entropy
from .lora import (
    LoraConfig,
    adapter_name,
    adapter_state,
    check_shardable,
    is_adapter_key,
    load_adapter_state,
    lora_adapter,
    lora_base,
    merged_weights,
    use_adapter,
    wrap_agent_lora,
    wrap_lora,
)
from .memory import check_train_memory
from .microbatch import split_micro_batches
from .mismatch import mismatch_report
from .packing import pack_rows, packed_token_logprobs_and_entropy
from .policy_loss import loss_normalizer, variant_loss_terms
from .precision import autocast, checkpoint_layers, floating_dtype, serving_weights, to_master_weights
from .tree_attention import supports_tree_attention

__all__ = ["Actor", "GRPOConfig"]

logger = logging.getLogger(__name__)


@dataclass
class _StepBatch:
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


@dataclass
class _Policies:
    """The log-probs the loss compares π_θ with (see `loss.py` for the three policies)."""

    old: Tensor  # π_old of the clipped ratio (π_behave in the decoupled loss)
    prox: Tensor | None  # π_prox: recomputed before the update, or filled by its forward
    recompute_skipped: bool  # the training forward fills `prox` (`Actor._recompute_is_redundant`)
    engine_as_old: bool  # π_old is the engine's record, not the recomputation
    prox_from_engine: bool = False  # `prox` is the engine's record (`engine_numerics.py`): no recomputation


@dataclass
class _UpdateResult:
    """What the optimizer steps of one train step report."""

    collector: InspectionCollector | None
    loss_stats: list[dict[str, float]] = field(default_factory=list)  # one per micro-batch
    minibatch_losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    trained_positions: int = 0  # positions the training forward computed (padded rows: with the padding)


class Actor:
    """Owns the trainable model, its AdamW optimizer and its policy version."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: GRPOConfig | None = None,
        ref_model: torch.nn.Module | None = None,
        version: int = 0,
        parallel: DataParallel | None = None,
        compute_dtype: torch.dtype | None = None,
        tokenizer: Any = None,
        agent_lora: dict[str, LoraConfig] | None = None,
        temperature: float = 1.0,
        engine_numerics: EngineNumerics | None = None,
    ) -> None:
        """`agent_lora` ({agent: LoraConfig}): one LoRA adapter per agent on the frozen base, each
        trained on its agent's rows only (see `_micro_batches`); `train_step` then needs
        the names of the batch's `agent_ids`. `temperature`: the one the engine sampled at (the
        Session's `rollout.temperature`); log-probs are recomputed at it. `engine_numerics`: how
        the engine that samples from this Actor's pushed weights computes its log-probs; where
        they are exactly π_prox (`engine_numerics.py`), the recomputation is skipped and they are
        used. None: always recompute."""
        if not temperature > 0:
            raise InvalidArgumentError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature
        # a transformers model (peft-wrapped with LoRA): its methods are read by name
        self.model: Any = model
        self.tokenizer = tokenizer  # replays recorded grammars (`cfg.replay_sampling_masks`)
        self.parallel = parallel  # None: one process trains on the whole batch
        self.cfg = cfg or GRPOConfig()
        self.ref_model = ref_model
        self.engine_numerics = engine_numerics
        self.version = version
        # an engine that serves this Actor's parameters themselves (`serve_in_place`), and whether
        # this step paused it (from its first optimizer step until the engine's version moved)
        self.in_place_engine: InferenceEngine | None = None
        self._paused_engine = False
        self.steps_done = 0  # train steps taken; drives the learning-rate schedule
        self.last_inspection: LossInspection | None = None  # set by train_step(inspect=True)
        # Mixed precision (`precision.py`): the forward and backward compute in `compute_dtype`
        # (default: the dtype the model came in), the trainable weights and AdamW's state stay
        # float32, and the engine gets the weights in the compute dtype at each push.
        self.compute_dtype = compute_dtype or floating_dtype(model)
        to_master_weights(model)
        # LoRA (`lora.py`): the base frozen, only the adapters train (and hold AdamW state); the
        # KL reference is the base with the adapters off, not a copy (`_reference_logprobs`)
        self.agents = list(agent_lora or ())  # agents with an adapter of their own
        self.lora = self.cfg.lora is not None or bool(self.agents)
        if self.lora:
            if ref_model is not None:
                raise InvalidArgumentError(
                    "actor.lora uses the base model with the adapters off as the KL reference: "
                    "pass no ref_model"
                )
            if self.agents and self.cfg.lora is not None:
                raise InvalidArgumentError(
                    "agent adapters (agent_lora) and actor.lora exclude each other: unset actor.lora"
                )
            if self.agents and parallel is not None and self.cfg.parallel == "fsdp":
                raise InvalidArgumentError(
                    "agent adapters train data-parallel with actor.parallel=ddp, not fsdp (a sharded "
                    "forward needs every rank to run the same adapter at once)"
                )
            # (peft first: FSDP then shards the injected layers, adapters and frozen base alike)
            lora = self.cfg.lora
            model = self.model = (
                wrap_lora(model, lora) if lora is not None else wrap_agent_lora(model, agent_lora or {})
            )
        # Dropout would make π_θ differ from the policy that sampled (ratios ≠ 1 on-policy).
        self.model.eval()
        # FSDP2 (data-parallel only): parameters, gradients and Adam state sharded over the ranks
        self.sharded = parallel is not None and self.cfg.parallel == "fsdp"
        if ref_model is not None:  # no gradients, no optimizer: it may as well be in the compute dtype
            ref_model.to(self.compute_dtype).eval().requires_grad_(False)
        if self.sharded:  # (FSDP gathers the weights in the compute dtype: no autocast then)
            if self.lora:
                check_shardable(model)
            fully_shard_model(lora_base(model), compute_dtype=self.compute_dtype)
            if ref_model is not None:  # the KL reference follows: 1/N of it per rank, no grads, no optimizer
                fully_shard_model(ref_model, frozen=True, compute_dtype=self.compute_dtype)
        # float16's narrow range underflows small gradients: the loss is scaled up for the
        # backward and the gradients down before clipping (steps with inf/NaN are skipped)
        self.grad_scaler = None
        if self.compute_dtype == torch.float16 and not self.sharded:
            self.grad_scaler = torch.amp.GradScaler(self.device.type)
        if self.cfg.gradient_checkpointing:
            checkpoint_layers(lora_base(model))
        self.params = [p for p in model.parameters() if p.requires_grad]
        # each agent's adapter is clipped on its own: the agents are separate policies
        self.agent_params = {
            agent: [
                p
                for n, p in model.named_parameters()
                if is_adapter_key(n) and adapter_name(agent) in n.split(".")
            ]
            for agent in self.agents
        }
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.cfg.lr,
            betas=self.cfg.betas,
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
        )
        if self.device.type == "cuda":  # refuse a config that cannot fit before the first step, not in it
            free, _ = torch.cuda.mem_get_info(self.device)
            check_train_memory(
                model,
                self.cfg,
                self.compute_dtype,
                free,
                shards=parallel.world_size if self.sharded and parallel is not None else 1,
            )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------- one step
    def train_step(
        self,
        batch: TrainBatch,
        *,
        credit: CreditMode | None = None,
        inspect: bool = False,
        agents: Sequence[str | None] | None = None,
    ) -> dict[str, float]:
        """Recompute log-probs, compute advantages, run `ppo_n_minibatches` optimizer steps.

        With `cfg.pack` the rows of one group (`batch.group_ids`; without them, each micro-batch)
        are merged into a token trie so shared prefixes are computed once; the per-row log-probs
        equal the padded computation (see `packing.py`).
        The no-grad recomputation of π_prox (π_old without the decoupled loss) is skipped when
        the training forward computes the same values (`cfg.skip_redundant_recompute`, one
        minibatch: the forward runs the pre-update weights); its detached log-probs are used
        instead and stats hold `recompute_skipped = 1`.

        `credit` ("leaf" | "turn") overrides `cfg.credit` for this step (a RolloutBatch's own
        setting). `inspect=True` keeps the update's per-token values in `self.last_inspection`
        (a `LossInspection`). `agents`: the names `batch.agent_ids` index (needed with agent
        adapters). Returns the step's stats; afterwards `self.version` is one higher.
        """
        start = time.perf_counter()
        if not isinstance(batch, TrainBatch):
            raise ArgumentTypeError(
                f"Actor.train_step takes a TrainBatch (RolloutBatch.to_tensors(), or "
                f"areal_nb.api.train_batch.TrainBatch(**tensors)), got {type(batch).__name__}"
            )
        step = self._prepare(batch)
        step.row_agents = self._row_agents(batch, agents)
        lr = self._set_learning_rate()
        policies = self._policies_before_update(step)
        adv, kl_stats = self._advantages(step, policies.old, credit)
        try:
            update = self._update(
                step,
                adv["advantages"],
                policies,
                InspectionCollector(step.input_ids.shape) if inspect else None,
            )
            self._publish_in_place(self.version + 1)
        finally:
            self._resume_in_place_engine()
        out = self._step_stats(step, adv, update, policies, kl_stats, lr, time.perf_counter() - start)
        if update.collector is not None:
            self.last_inspection = self._inspection(
                update.collector, step.batch, step.mask, policies.old, policies.prox, out
            )
            self.last_inspection.groups = None if step.pack_ids is None else step.pack_ids.cpu()
        self.version += 1
        self.steps_done += 1
        del step, policies, adv, update  # the step's tensors, before their memory goes back
        release_freed_memory()  # the step's activations and logits (`heap.py`)
        return out

    # ------------------------------------------------------- the step's phases
    def _prepare(self, batch: TrainBatch) -> _StepBatch:
        """The batch on the model's device, its loss mask and its packing groups."""
        batch = batch.to(self.device)
        input_ids, attention = batch.input_ids, batch.attention_mask
        n_rows = input_ids.shape[0]
        if n_rows < self.cfg.ppo_n_minibatches:
            raise TrainBatchError(
                f"batch has {n_rows} rows, fewer than ppo_n_minibatches={self.cfg.ppo_n_minibatches}"
            )
        group_ids = batch.group_ids
        pack_ids = group_index(group_ids, n_rows).to(input_ids.device) if group_ids is not None else None
        engine_logprobs, allowed = batch.logprobs.float(), {}
        if self.cfg.replay_sampling_masks and batch.sampling_logprobs is not None:
            # π_behave: the recorded log-probs under the distribution each token was sampled from
            engine_logprobs, allowed = batch.sampling_logprobs.float(), self._allowed_sets(batch)
        return _StepBatch(
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

    def _row_agents(self, batch: TrainBatch, agents: Sequence[str | None] | None) -> list[str] | None:
        """Each row's agent (agent adapters only), checked to have an adapter."""
        if not self.agents:
            return None
        if agents is None or batch.agent_ids is None:
            raise TrainBatchError(
                f"this Actor trains one adapter per agent ({self.agents}): train_step needs "
                "batch.agent_ids and the agents' names (agents=)"
            )
        names = [agents[int(i)] for i in batch.agent_ids.tolist()]
        strangers = sorted({str(n) for n in names if n not in self.agents})
        if strangers:
            raise TrainBatchError(
                f"rows of agent(s) {strangers}, which have no adapter: this Actor trains {self.agents}"
            )
        return [str(n) for n in names]

    def _allowed_sets(self, batch: TrainBatch) -> dict[int, tuple[Tensor, Tensor]]:
        """Each masked token's allowed set, rebuilt from the batch's `sampling_spans` (the grammar
        replayed over the recorded output with this Actor's tokenizer, or the kept ids)."""
        vocab = int(self.model.get_input_embeddings().num_embeddings)  # the engine's mask width
        masked, spans_per_row = batch.sampling_masked, batch.sampling_spans
        if masked is None or spans_per_row is None:
            raise TrainBatchError(
                "TrainBatch.sampling_logprobs comes with sampling_masked and sampling_spans"
            )
        out: dict[int, tuple[Tensor, Tensor]] = {}
        for row, spans in enumerate(spans_per_row):
            positions, sets = [], []
            for span in spans:
                if span.masks.constraint is not None and self.tokenizer is None:
                    raise InvalidArgumentError(
                        "replaying a recorded grammar needs the tokenizer: Actor(..., tokenizer=...)"
                    )
                allowed = span.masks.allowed(span.tokens, self.tokenizer, vocab)
                for i, pos in span.positions(masked.shape[1]):
                    if bool(masked[row, pos]):
                        positions.append(pos)
                        sets.append(allowed[i])
            if positions:
                out[row] = (torch.tensor(positions, dtype=torch.long), torch.stack(sets))
        return out

    def _micro_allowed(self, step: _StepBatch, micro: Tensor, width: int) -> tuple[Tensor, Tensor] | None:
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

    def _set_learning_rate(self) -> float:
        """This step's scheduled learning rate, set on the optimizer."""
        cfg = self.cfg
        lr = cfg.lr_at(self.steps_done)
        if lr == 0.0 and self.steps_done == cfg.lr_decay_steps:  # warn once, on the first idle step
            logger.warning(
                "the %s learning-rate schedule reached 0 after lr_decay_steps=%d train steps: further "
                "steps do not change the weights (raise total_steps / actor.lr_decay_steps, or set "
                "actor.min_lr_ratio > 0)",
                cfg.lr_schedule,
                cfg.lr_decay_steps,
            )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _policies_before_update(self, step: _StepBatch) -> _Policies:
        """π_prox (recomputed now, or left to the training forward) and the π_old of the ratio."""
        cfg = self.cfg
        # π_old in the clipped ratio: the engine's record in decoupled mode or without
        # recomputation; otherwise the recomputed values (identical on-policy, but exact).
        engine_as_old = cfg.use_decoupled_loss or not cfg.recompute_logprob
        redundant = cfg.computes_prox_logprobs and self._recompute_is_redundant()
        if cfg.computes_prox_logprobs and not redundant and self._engine_records_prox(step):
            # the engine sampled with these weights in this dtype: its record is the recomputation
            # (where the training forward computes π_prox anyway, that exact value is kept instead,
            # and with it the engine-vs-trainer drift check)
            recorded = step.engine_logprobs
            return _Policies(
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
            prox = self._logprobs_no_grad(self.model, step)
        # (skipped recomputation without the decoupled loss: only the loss reads π_old, and takes
        # it from the forward; kl_ctl is 0 there, so the advantages do not read it)
        # (prox is the recomputation whenever π_old is not the engine's record)
        old = step.engine_logprobs if engine_as_old or skipped or prox is None else prox
        return _Policies(old=old, prox=prox, recompute_skipped=skipped, engine_as_old=engine_as_old)

    def _advantages(
        self, step: _StepBatch, old_logprobs: Tensor, credit: CreditMode | None
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        """Per-token advantages (with the KL penalty's reference log-probs when `kl_ctl > 0`)."""
        cfg = self.cfg
        ref = step.batch.ref_logprobs
        if cfg.kl_ctl > 0 and ref is None:
            ref = self._reference_logprobs(step)
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

    def _reference_logprobs(self, step: _StepBatch) -> Tensor:
        """The KL reference's log-probs: its own model, or (LoRA) the base with the adapters off."""
        if self.lora:
            with self.model.disable_adapter():
                return self._logprobs_no_grad(self.model, step)
        if self.ref_model is None:
            raise InvalidArgumentError("kl_ctl > 0 needs a ref_model for the Actor or batch.ref_logprobs")
        return self._logprobs_no_grad(self.ref_model, step)

    def _update(
        self, step: _StepBatch, advantages: Tensor, policies: _Policies, collector: InspectionCollector | None
    ) -> _UpdateResult:
        """`ppo_n_minibatches` optimizer steps, each on the gradients summed over its micro-batches."""
        result = _UpdateResult(collector=collector)
        minibatches = torch.arange(step.n_rows, device=step.input_ids.device).tensor_split(
            self.cfg.ppo_n_minibatches
        )
        for minibatch, rows in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            result.minibatch_losses.append(
                self._accumulate_gradients(step, rows, minibatch, advantages, policies, result)
            )
            trained = None if step.row_agents is None else {step.row_agents[r] for r in rows.tolist()}
            result.grad_norms.append(self._clip_and_step(trained))
        self.optimizer.zero_grad(set_to_none=True)
        if self.parallel is not None:  # every rank reports the whole batch's figures
            result.loss_stats, result.minibatch_losses, result.trained_positions = _gather_step(
                self.parallel, result.loss_stats, result.minibatch_losses, result.trained_positions, collector
            )
            if policies.recompute_skipped:
                assert policies.prox is not None
                self.parallel.sum_(policies.prox)  # each rank filled its own rows
        return result

    def _accumulate_gradients(
        self,
        step: _StepBatch,
        rows: Tensor,
        minibatch: int,
        advantages: Tensor,
        policies: _Policies,
        result: _UpdateResult,
    ) -> float:
        """Forward and backward of this process's micro-batches of `rows`; returns their loss.

        Every micro-batch divides by the minibatch's divisor (token_mean: its token count), so
        summed gradients are exactly those of the whole minibatch's loss. Data-parallel, the
        divisor is the whole minibatch's (every rank has the batch), the sum runs over ranks."""
        cfg = self.cfg
        # algorithm hook: the aggregation's divisor (`policy_loss.loss_normalizer`)
        assert cfg.loss_agg is not None, "every preset sets loss_agg (GRPOConfig.__post_init__)"
        normalizer = loss_normalizer(step.mask, rows, cfg.loss_agg, cfg.loss_agg_constant)
        minibatch_loss = 0.0
        for micro in self._micro_batches(rows, step):
            if not len(micro):  # FSDP: a pass of zero loss, so this rank joins the others' collectives
                self._empty_pass(self.model, step.input_ids, backward=True)
                continue
            cols = slice(0, int(step.attention[micro].sum(1).max()))  # right padding: drop all-pad columns
            # per-row [b, width] log-probs and entropy, packed or not: the loss sees rows. They are
            # read only on the loss mask (loss, advantages, KL, stats and inspection are masked),
            # so the packed forward runs the LM head there only.
            self._use_adapter_of(step, micro)
            logprobs, entropy, positions = self._row_logprobs(
                self.model,
                step.input_ids[micro, cols],
                step.attention[micro, cols],
                None if step.pack_ids is None else step.pack_ids[micro],
                step.mask[micro, cols],
                self._micro_allowed(step, micro, cols.stop),
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
            (terms.loss if self.grad_scaler is None else self.grad_scaler.scale(terms.loss)).backward()
            minibatch_loss += float(terms.loss.detach())
            result.loss_stats.append(terms.stats)
        return minibatch_loss

    def _clip_and_step(self, trained_agents: set[str] | None = None) -> float:
        """Sum the ranks' gradients (DDP), clip them, take one optimizer step; the gradient norm
        (agent adapters: each adapter clipped on its own, the norm over all of them; an agent
        with no row in the minibatch, `trained_agents`, takes no step, as in one process)."""
        if self.parallel is not None and not self.sharded:  # (FSDP has reduce-scattered them)
            self.parallel.all_reduce_grads(self.params)
            for agent, params in self.agent_params.items():
                if trained_agents is not None and agent not in trained_agents:
                    for p in params:  # (the all-reduce gave it zeros, which AdamW's momentum would step)
                        p.grad = None
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        if self.agents:
            norms = [
                torch.nn.utils.clip_grad_norm_(params, max_norm) for params in self.agent_params.values()
            ]
            norm = torch.stack(norms).norm()
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # (FSDP: a DTensor, the global norm)
        self._pause_in_place_engine()  # the step writes the parameters the engine reads
        if self.grad_scaler is None:
            self.optimizer.step()
        else:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        return float(full_state_dict(norm))

    def _step_stats(
        self,
        step: _StepBatch,
        adv: dict[str, Tensor],
        update: _UpdateResult,
        policies: _Policies,
        kl_stats: dict[str, float],
        lr: float,
        elapsed: float,
    ) -> dict[str, float]:
        cfg = self.cfg
        mask = step.mask
        out = {
            "loss": sum(update.minibatch_losses) / len(update.minibatch_losses),
            "grad_norm": sum(update.grad_norms) / len(update.grad_norms),
            **_reward_and_advantage_stats(step.batch.rewards, adv["scores"], adv["advantages"], mask),
            **_aggregate(update.loss_stats),
            **self._staleness(step.batch.versions, mask),
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
        out["version"] = float(self.version)
        out["lr"] = lr
        return out

    # ------------------------------------------------------------ helpers
    def _micro_batches(self, rows: Tensor, step: _StepBatch) -> list[Tensor]:
        """The micro-batches of `rows` this process computes (all rows without data parallelism);
        through the sharded model, as many as every other rank (some empty). With agent adapters
        each micro-batch holds one agent's rows (a forward runs one adapter)."""
        cfg = self.cfg
        if step.row_agents is not None:
            by_agent: dict[str, list[int]] = {}
            for row in rows.tolist():
                by_agent.setdefault(step.row_agents[row], []).append(row)
            agent_step = replace(step, row_agents=None)
            return [
                micro
                for agent_rows in by_agent.values()
                for micro in self._micro_batches(torch.tensor(agent_rows, device=rows.device), agent_step)
            ]
        if self.parallel is None:
            return split_micro_batches(
                rows, step.lengths, cfg.micro_batch_size, cfg.max_tokens_per_microbatch
            )
        same_count = self.sharded  # (the policy and the reference alike)
        return self.parallel.micro_batches(
            rows,
            step.lengths,
            cfg.micro_batch_size,
            same_count=same_count,
            pack_ids=step.pack_ids if same_count and cfg.pack else None,
            max_tokens=cfg.max_tokens_per_microbatch,
        )

    def _use_adapter_of(self, step: _StepBatch, micro: Tensor) -> None:
        """Agent adapters: the next forwards run the adapter of `micro`'s agent (one per micro-batch)."""
        if step.row_agents is not None:
            use_adapter(self.model, step.row_agents[int(micro[0])])

    def _engine_records_prox(self, step: _StepBatch) -> bool:
        """Whether the batch's recorded log-probs are this Actor's π_prox (`engine_numerics.py`);
        never with `skip_redundant_recompute` off (it forces the recomputation)."""
        return (
            self.cfg.skip_redundant_recompute
            and not self.lora  # (the engine serves base + ΔW merged: another rounding than the adapters' forward)
            and not step.allowed  # (replayed masks renormalise the recomputation)
            and engine_logprobs_are_current(
                self.engine_numerics,
                compute_dtype=self.compute_dtype,
                model_dtype=floating_dtype(self.model),
                device=self.device,
                temperature=self.temperature,
                versions=step.batch.versions,
                mask=step.mask,
                version=self.version,
            )
        )

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
        self,
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
        (`_micro_allowed`) the padded rows run, those tokens renormalised over their allowed sets
        (the packed forward does not take masks)."""
        model = lora_base(model)  # LoRA: the base with its injected adapters (the fast paths walk its layers)
        with autocast(self.device, None if self.sharded else self.compute_dtype):
            if self.cfg.pack and allowed is None:
                flat = self.cfg.tree_attention and supports_tree_attention(model)
                packed = pack_rows(input_ids, attention, pack_ids, flat=flat)
                logprobs, entropy = packed_token_logprobs_and_entropy(
                    model,
                    packed,
                    self.temperature,
                    positions=needed,
                    last_layer_at_heads=self.cfg.last_layer_at_heads,
                    chunk=self.cfg.logprob_chunk_size,
                )
                assert entropy is not None
                return logprobs, entropy, packed.n_nodes
            logprobs, entropy = compute_token_logprobs_and_entropy(
                model,
                input_ids,
                attention,
                self.temperature,
                chunk=self.cfg.logprob_chunk_size,
                allowed=allowed,
            )
            return logprobs, entropy, input_ids.numel()

    def _inspection(
        self,
        collector: InspectionCollector,
        batch: TrainBatch,
        mask: Tensor,
        old_logprobs: Tensor,
        prox_logprobs: Tensor | None,
        stats: dict[str, float],
    ) -> LossInspection:
        cfg = self.cfg
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
            version=self.version,
            stats=dict(stats),
            **collector.tensors,
        )

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, step: _StepBatch) -> Tensor:
        """Log-probs of every row (at least on the loss mask); data-parallel, each rank computes
        its micro-batches and the ranks sum their (otherwise zero) rows."""
        input_ids, attention, pack_ids = step.input_ids, step.attention, step.pack_ids
        rows = torch.arange(step.n_rows, device=input_ids.device)
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        for micro in self._micro_batches(rows, step):
            if not len(micro):
                self._empty_pass(model, input_ids, backward=False)
                continue
            width = int(attention[micro].sum(1).max())
            if model is self.model:
                self._use_adapter_of(step, micro)
            out[micro, :width] = self._row_logprobs(
                model,
                input_ids[micro, :width],
                attention[micro, :width],
                None if pack_ids is None else pack_ids[micro],
                step.mask[micro, :width],
                self._micro_allowed(step, micro, width),
            )[0]
        if self.parallel is not None:
            self.parallel.sum_(out)
        return out

    def _empty_pass(self, model: torch.nn.Module, input_ids: Tensor, backward: bool) -> None:
        """A forward (and backward) of one token with zero loss: under FSDP every rank must run
        the same number of passes (each gathers and reduce-scatters with the others)."""
        with autocast(self.device, None if self.sharded else self.compute_dtype):
            logits = lora_base(model)(input_ids=input_ids[:1, :1], use_cache=False).logits
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
    def serve_in_place(self, engine: InferenceEngine) -> None:
        """`engine` serves this Actor's parameters themselves (`LocalEngine(share_weights=True)`
        on the policy): no copy per push. From then on each train step pauses it before its first
        optimizer step (which writes the parameters in place; forwards and backwards only read
        them) and resumes it once the engine's version is the step's new one, so a token is never
        sampled by updated weights under the old version. Not with adapters (the engine serves
        merged weights) nor data-parallel (the parameters are the ranks' replicas or shards).
        (Pausing is not counted: a train step resumes the engine it paused, even one paused before.)"""
        if self.lora or self.parallel is not None:
            raise InvalidArgumentError(
                "an engine serves the Actor's parameters in place only without LoRA and without data "
                "parallelism (it is pushed merged or gathered weights there)"
            )
        self.in_place_engine = engine

    def _pause_in_place_engine(self) -> None:
        engine = self.in_place_engine
        if engine is not None and not self._paused_engine:
            engine.pause()  # (returns once no decoding step runs)
            self._paused_engine = True

    def _publish_in_place(self, version: int) -> None:
        """The in-place engine's version moves to `version` while it is paused (no copy: its
        weights are these)."""
        if self.in_place_engine is not None and self._paused_engine:
            self.in_place_engine.update_weights(self._served_weights(), version=version)

    def _resume_in_place_engine(self) -> None:
        if self._paused_engine:
            self._paused_engine = False
            assert self.in_place_engine is not None
            self.in_place_engine.resume()

    def _served_weights(self) -> dict[str, Tensor]:
        """What the in-place engine serves: the parameters themselves (`serving_weights` casts
        nothing, they are in the engine's dtype)."""
        return serving_weights(self.model.state_dict(), self.compute_dtype)

    def push_weights(self, engine: InferenceEngine | None, version: int | None = None) -> int:
        """Send the current weights, in the compute dtype the engine serves, to the engine;
        tokens sampled afterwards carry `version`. `engine` is None on the ranks ≠ 0 of a torchrun
        Session, which take part in gathering the weights (FSDP) but serve nothing.

        The engine must copy the tensors (they are the live parameters, which the next step
        changes in place), unless it serves them in place (`serve_in_place`): then the train step
        already moved its version, and a push to another version only moves it again.
        """
        version = self.version if version is None else version
        if engine is not None and engine is self.in_place_engine:
            if engine.get_version() != version:
                engine.update_weights(self._served_weights(), version=version)
            return version
        if self.agents:
            if engine is None:
                return version
            if engine.serves_lora_adapters:  # servers apply each agent's adapter
                per_agent = {a: self.agent_adapter(a) for a in self.agents}
            else:  # each agent's embedded engine serves base + its ΔW merged (engine.agent_engines)
                per_agent = {
                    a: serving_weights(self.policy_weights(a), self.compute_dtype) for a in self.agents
                }
            engine.update_weights(AgentWeights(per_agent), version=version)
            return version
        serves_adapters = self.lora and engine is not None and engine.serves_lora_adapters
        if self.lora and self.sharded:  # every rank takes part in the same gathers: rank 0's engine decides
            assert self.parallel is not None
            serves_adapters = self.parallel.broadcast(serves_adapters)
        elif engine is None and not self.sharded:  # (a DDP replica: nothing to gather or send)
            return version
        if serves_adapters:
            # LoRA on servers that apply adapters themselves: the adapter alone (peft's files)
            adapter = lora_adapter(self.model, self.adapter_weights() if self.sharded else None)
            if engine is not None:
                engine.update_weights(adapter, version=version)
            return version
        # LoRA otherwise: the engine serves base + ΔW merged (its forward stays the plain model's)
        weights = serving_weights(self.policy_weights(), self.compute_dtype)
        if engine is not None:
            engine.update_weights(weights, version=version)
        return version

    def weights(self) -> dict[str, Tensor]:
        """The model's full weights by name. Sharded (FSDP) a gather that every rank calls."""
        return full_state_dict(self.model.state_dict()) if self.sharded else self.model.state_dict()

    def policy_weights(self, agent: str | None = None) -> dict[str, Tensor]:
        """The policy's full weights under the plain model's names: with LoRA the base with each
        ΔW merged in (what the engine serves). Sharded (FSDP) a gather that every rank calls.
        Agent adapters: `agent`'s policy (the base with its adapter's ΔW)."""
        if not self.lora:
            return self.weights()
        if self.agents:
            use_adapter(self.model, self._known_agent(agent))
            return merged_weights(self.model)
        base = lora_base(self.model).state_dict()
        return merged_weights(self.model, state=full_state_dict(base) if self.sharded else None)

    def agent_adapter(self, agent: str) -> Any:
        """Agent adapters: `agent`'s adapter as peft saves it (a `LoraAdapter`)."""
        use_adapter(self.model, self._known_agent(agent))
        return lora_adapter(self.model)

    def _known_agent(self, agent: str | None) -> str:
        if agent not in self.agents:
            raise InvalidArgumentError(
                f"this Actor trains one adapter per agent: name one of {self.agents}, got {agent!r}"
            )
        assert agent is not None
        return agent

    def adapter_weights(self) -> dict[str, Tensor]:
        """A LoRA actor's adapter tensors, full (sharded: a gather every rank calls)."""
        adapters = adapter_state(self.model.state_dict())
        return full_state_dict(adapters) if self.sharded else adapters

    def state_dict(self) -> dict[str, Any]:
        """Full weights and optimizer state (sharded: gathered, on every rank that calls it).
        LoRA: the adapter's tensors only (the frozen base is the model it was loaded from)."""
        optimizer = self.optimizer.state_dict()
        return {
            "model": self.adapter_weights() if self.lora else self.weights(),
            "optimizer": full_state_dict(optimizer) if self.sharded else optimizer,
            "version": self.version,
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s full tensors; sharded, each rank keeps its own shards (no
        communication)."""
        if self.lora:
            self.load_adapter_weights(state["model"])
        else:
            self.model.load_state_dict(
                shard_like(state["model"], self.model.state_dict()) if self.sharded else state["model"]
            )
        self.load_optimizer_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.steps_done = int(state.get("steps_done", 0))

    def load_adapter_weights(self, adapters: dict[str, Tensor]) -> None:
        """Restore `adapter_weights()`'s full tensors; sharded, each rank keeps its own shards."""
        own = self.model.state_dict()
        load_adapter_state(self.model, shard_like(adapters, own) if self.sharded else adapters)

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
            raise InvalidArgumentError("this Actor has no reference model (actor.kl_ctl is 0)")
        self.ref_model.load_state_dict(
            shard_like(state, self.ref_model.state_dict()) if self.sharded else state
        )

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's full state (a checkpoint's, or rank 0's), cut to this rank's shards."""
        if self.sharded:  # Adam's moments are shaped like their parameters: shard them alike
            state = {
                **state,
                "state": {
                    i: {
                        k: shard_like(v, self.params[i]) if _shaped_like(v, self.params[i]) else v
                        for k, v in moments.items()
                    }
                    for i, moments in state["state"].items()
                },
            }
        self.optimizer.load_state_dict(state)


def _shaped_like(value: Any, param: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == param.shape


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

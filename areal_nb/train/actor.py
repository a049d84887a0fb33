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

The step's phases live beside this facade, one job each: `step_batch.py` (the batch as the phases
read it), `actor_policies.py` (π_prox, π_old and the advantages), `actor_forward.py` (micro-batches
and their log-prob forwards), `actor_update.py` (the optimizer steps), `step_stats.py` (the stats
and the loss inspection), `weight_push.py` (weights to the engine) and `actor_state.py`
(checkpoint state).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_nb.api import CreditMode, InferenceEngine
from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

from . import actor_state, weight_push
from .actor_forward import logprobs_no_grad
from .actor_policies import policies_before_update, step_advantages
from .actor_update import optimizer_steps, set_learning_rate
from .config import GRPOConfig
from .distributed import DataParallel, fully_shard_model
from .engine_numerics import EngineNumerics
from .heap import release_freed_memory
from .inspection import InspectionCollector, LossInspection
from .lora import (
    LoraConfig,
    adapter_name,
    check_shardable,
    is_adapter_key,
    lora_base,
    wrap_agent_lora,
    wrap_lora,
)
from .memory import check_train_memory
from .precision import checkpoint_layers, floating_dtype, to_master_weights
from .step_batch import StepBatch, prepare_step, row_agents
from .step_stats import loss_inspection, step_stats
from .weight_push import publish_in_place, resume_in_place_engine

__all__ = ["Actor", "GRPOConfig"]


class Actor:
    """Owns the trainable model, its AdamW optimizer and its policy version."""

    # The constructor wires the parts in the one order that works (LoRA wrap, then sharding, then
    # the optimizer over what is left trainable): one sequence, read top to bottom.
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
        trained on its agent's rows only (see `actor_forward.micro_batches`); `train_step` then needs
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
        self.in_place_written: tuple[int, ...] | None = None  # LoRA in place: see `weight_push._writes`
        self.steps_done = 0  # train steps taken; drives the learning-rate schedule
        self.last_inspection: LossInspection | None = None  # set by train_step(inspect=True)
        # Mixed precision (`precision.py`): the forward and backward compute in `compute_dtype`
        # (default: the dtype the model came in), the trainable weights and AdamW's state stay
        # float32, and the engine gets the weights in the compute dtype at each push.
        self.compute_dtype = compute_dtype or floating_dtype(model)
        to_master_weights(model)
        # LoRA (`lora.py`): the base frozen, only the adapters train (and hold AdamW state); the
        # KL reference is the base with the adapters off, not a copy (`actor_policies.reference_logprobs`)
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
        # On CPU torch's default AdamW loops over the parameters in Python, several passes and a
        # temporary each (its multi-tensor path is for accelerators); the fused kernel updates a
        # parameter in one pass with no temporary: on SmolLM2-135M's parameters 0.25-1.0 s a step
        # instead of 3-9 s (benchmarks/RESULTS.md). The same update up to float32 rounding.
        on_cpu = not self.sharded and all(p.device.type == "cpu" for p in self.params)
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=self.cfg.lr,
            betas=self.cfg.betas,
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
            fused=True if on_cpu else None,
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
        # what was freed since the last step (the rollout's, an engine's dropped caches) goes back
        # to the OS before this step's activations need memory (`heap.py`)
        release_freed_memory()
        step = prepare_step(self, batch)
        step.row_agents = row_agents(self, batch, agents)
        lr = set_learning_rate(self)
        policies = policies_before_update(self, step)
        adv, kl_stats = step_advantages(self, step, policies.old, credit)
        try:
            update = optimizer_steps(
                self,
                step,
                adv["advantages"],
                policies,
                InspectionCollector(step.input_ids.shape) if inspect else None,
            )
            publish_in_place(self, self.version + 1)
        finally:
            resume_in_place_engine(self)
        out = step_stats(self, step, adv, update, policies, kl_stats, lr, time.perf_counter() - start)
        if update.collector is not None:
            self.last_inspection = loss_inspection(
                self, update.collector, step.batch, step.mask, policies.old, policies.prox, out
            )
            self.last_inspection.groups = None if step.pack_ids is None else step.pack_ids.cpu()
        self.version += 1
        self.steps_done += 1
        del step, policies, adv, update  # the step's tensors, before their memory goes back
        release_freed_memory()  # the step's activations and logits (`heap.py`)
        return out

    def _logprobs_no_grad(self, model: torch.nn.Module, step: StepBatch) -> Tensor:
        """The no-grad forward of every row (`actor_forward.logprobs_no_grad`): π_prox's
        recomputation and the KL reference's; a method, so that a profiler can wrap it."""
        return logprobs_no_grad(self, model, step)

    # ---------------------------------------------------------------- weights
    def serve_in_place(self, engine: InferenceEngine) -> None:
        """`engine` serves this Actor's parameters themselves (`LocalEngine(share_weights=True)`
        on the policy): no copy per push. From then on each train step pauses it before its first
        optimizer step (which writes the parameters in place; forwards and backwards only read
        them) and resumes it once the engine's version is the step's new one, so a token is never
        sampled by updated weights under the old version. With LoRA (`cfg.lora`, linear layers)
        the engine serves the frozen base and the adapter tensors themselves (base(x) +
        scaling·B(A(x)) per adapted layer, no merged copy). Not with agent adapters (an engine per
        agent, each its merged policy) nor data-parallel (the parameters are the ranks' replicas
        or shards).
        (Pausing is not counted: a train step resumes the engine it paused, even one paused before.)"""
        weight_push.serve_in_place(self, engine)

    def push_weights(self, engine: InferenceEngine | None, version: int | None = None) -> int:
        """Send the current weights, in the compute dtype the engine serves, to the engine;
        tokens sampled afterwards carry `version`. `engine` is None on the ranks ≠ 0 of a torchrun
        Session, which take part in gathering the weights (FSDP) but serve nothing.

        The engine must copy the tensors (they are the live parameters, which the next step
        changes in place), unless it serves them in place (`serve_in_place`): then the train step
        already moved its version, and a push to another version only moves it again.
        """
        return weight_push.push_weights(self, engine, version)

    def weights(self) -> dict[str, Tensor]:
        """The model's full weights by name. Sharded (FSDP) a gather that every rank calls."""
        return weight_push.weights(self)

    def policy_weights(self, agent: str | None = None) -> dict[str, Tensor]:
        """The policy's full weights under the plain model's names: with LoRA the base with each
        ΔW merged in (what the engine serves). Sharded (FSDP) a gather that every rank calls.
        Agent adapters: `agent`'s policy (the base with its adapter's ΔW)."""
        return weight_push.policy_weights(self, agent)

    def agent_adapter(self, agent: str) -> Any:
        """Agent adapters: `agent`'s adapter as peft saves it (a `LoraAdapter`)."""
        return weight_push.agent_adapter(self, agent)

    def adapter_weights(self) -> dict[str, Tensor]:
        """A LoRA actor's adapter tensors, full (sharded: a gather every rank calls)."""
        return weight_push.adapter_weights(self)

    # ---------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Full weights and optimizer state (sharded: gathered, on every rank that calls it).
        LoRA: the adapter's tensors only (the frozen base is the model it was loaded from)."""
        return actor_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s full tensors; sharded, each rank keeps its own shards (no
        communication)."""
        actor_state.load_state_dict(self, state)

    def load_adapter_weights(self, adapters: dict[str, Tensor]) -> None:
        """Restore `adapter_weights()`'s full tensors; sharded, each rank keeps its own shards."""
        actor_state.load_adapter_weights(self, adapters)

    def ref_weights(self) -> dict[str, Tensor] | None:
        """The KL reference's full weights (None without one). Sharded: a gather every rank calls."""
        return actor_state.ref_weights(self)

    def load_ref_weights(self, state: dict[str, Tensor]) -> None:
        """Restore `ref_weights()`'s full tensors; sharded, each rank keeps its own shards (no
        communication)."""
        actor_state.load_ref_weights(self, state)

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's full state (a checkpoint's, or rank 0's), cut to this rank's shards."""
        actor_state.load_optimizer_state_dict(self, state)

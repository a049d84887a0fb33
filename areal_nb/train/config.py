"""`GRPOConfig`: every knob of one GRPO/PPO training step (defaults follow AReaL's actor).

A pydantic dataclass: each knob's type (a `Literal` for a choice) and bounds are checked once,
when the config is made, whether from YAML through the Session's config or by hand; the checks
that tie knobs together run after (`__post_init__`, `algorithms.check_algorithm`).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

from areal_nb.api import CreditMode, CreditNorm
from areal_nb.errors import ConfigError

from .lora import LoraConfig

_LrSchedule = Literal["constant", "linear", "cosine"]
_ParallelMode = Literal["ddp", "fsdp"]
Algorithm = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp"]
AdvEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"]
ImportanceLevel = Literal["token", "sequence"]
PolicyLoss = Literal["ppo", "cispo"]
MismatchCorrection = Literal["tis", "mis"]
MismatchLevel = Literal["token", "sequence"]
_RewardNorm = Literal["group", "batch"]
_KlEstimator = Literal["k1", "k2", "k3"]


@dataclass(config=ConfigDict(extra="forbid"))
class GRPOConfig:
    """`actor`: the trainer. The algorithm's knobs marked "preset" take the value of `algorithm`'s
    preset unless set (docs/algorithms.md); the rest apply to every algorithm."""

    # optimizer
    lr: Annotated[float, Field(gt=0)] = 3e-4
    """AdamW's learning rate (the peak, with a schedule)."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's betas."""
    adam_eps: float = 1e-8
    """AdamW's eps."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this total norm; <= 0: no clipping."""
    # learning-rate schedule over train steps (one train step = ppo_n_minibatches optimizer steps)
    lr_schedule: _LrSchedule = "constant"
    """"constant", "linear" or "cosine" (decay after the warm-up, over train steps)."""
    lr_warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Train steps of linear warm-up, from lr/(warmup+1) to lr."""
    lr_decay_steps: Annotated[int | None, Field(ge=1)] = None
    """Train steps to reach `min_lr_ratio`·lr; None: the Session's `total_steps`."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Where the decay ends, as a fraction of lr."""
    # The algorithm (`algorithms.py`): a preset of the knobs below marked "preset", each of which
    # an explicit value overrides (None: the preset's value, filled in when the config is made).
    algorithm: Algorithm = "grpo"
    """The preset: grpo | dr_grpo | dapo | gspo | cispo | rloo | reinforce_pp."""
    adv_estimator: AdvEstimator | None = None
    """Preset: grpo | dr_grpo | rloo | reinforce_pp, how advantages come from rewards (adv_estimators.py)."""
    loss_agg: LossAggregation | None = None
    """Preset: token_mean | seq_mean_token_mean | seq_sum_norm, how token losses are averaged (policy_loss.py)."""
    loss_agg_constant: Annotated[int | None, Field(ge=1)] = None
    """seq_sum_norm's divisor; None: the batch's longest generated row."""
    importance_level: ImportanceLevel | None = None
    """Preset: token (PPO's ratio per token) | sequence (GSPO's geometric mean over the row)."""
    policy_loss: PolicyLoss | None = None
    """Preset: ppo | cispo."""
    dynamic_sampling: bool | None = None
    """Preset: drop groups whose rewards are all equal and refill the batch (DAPO)."""
    dynamic_sampling_max_rounds: Annotated[int, Field(ge=0)] = 3
    """Extra rollouts at most per step to refill the batch."""
    overlong_max_len: Annotated[int | None, Field(ge=1)] = None
    """DAPO's soft overlong penalty: L_max in generated tokens; None: no penalty."""
    overlong_buffer: int | None = None
    """The penalty's ramp, L_cache tokens before L_max; None: a fifth of L_max."""
    overlong_penalty: Annotated[float, Field(ge=0)] = 1.0
    """The penalty at and beyond L_max."""
    # Train-inference mismatch (`mismatch.py`): engine log-probs vs the trainer's recomputation
    mismatch_correction: MismatchCorrection | None = None
    """The engine's log-probs vs the trainer's: "tis" truncates each token's weight at
    `mismatch_threshold`, "mis" masks tokens above it; None: no correction."""
    mismatch_level: MismatchLevel = "token"
    """"token": a weight per token; "sequence": the row's product on all its tokens."""
    mismatch_threshold: Annotated[float, Field(gt=1)] = 2.0
    """C: a weight above it is truncated to it (tis) or its token masked (mis)."""
    # PPO objective
    eps_clip: Annotated[float | None, Field(gt=0)] = None
    """Preset: the clip range ε of the ratio (grpo: 0.2)."""
    eps_clip_higher: Annotated[float | None, Field(gt=0)] = None
    """Preset: the upper clip range, if it differs (grpo: None, symmetric clipping)."""
    c_clip: Annotated[float | None, Field(gt=1)] = None
    """Dual clip for negative advantages (> 1); None: off."""
    ppo_n_minibatches: Annotated[int, Field(ge=1)] = 1
    """Optimizer steps per train step (the batch split into this many minibatches)."""
    micro_batch_size: Annotated[int | None, Field(ge=1)] = None
    """Rows per forward/backward; None: the whole minibatch."""
    max_tokens_per_microbatch: Annotated[int | None, Field(ge=1)] = None
    """Tokens per forward/backward (the rows' tokens, prompt included): consecutive rows of a
    minibatch join a micro-batch while their tokens stay within it (a longer row runs alone).
    Bounds activation memory whatever the rows' lengths. None: no token limit."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (torch.utils.checkpoint per layer): activation memory ~1/layers for ~1/3 more compute."""
    logprob_chunk_size: Annotated[int, Field(ge=0)] = 1024
    """The LM head and log-softmax run this many tokens at a time, forward and backward
    (`lm_head.py`): no float32 [tokens, vocab] tensor larger than one chunk. 0: all at once."""
    # rewards and advantages
    reward_scaling: float = 1.0
    """Rewards are shaped as clip((reward + bias) · scaling, −clip, clip) before the advantages."""
    reward_bias: float = 0.0
    """See `reward_scaling`."""
    reward_clip: Annotated[float, Field(gt=0)] = 20.0
    """See `reward_scaling`."""
    reward_norm: _RewardNorm | None = "group"
    """The pool the advantage's baseline is taken over: "group" (GRPO), "batch", or None (no baseline)."""
    adv_norm: Literal["batch"] | None = None
    """"batch": advantages normalised over the batch's generated tokens; None: not."""
    norm_eps: float = 1e-5
    """Added to the standard deviation in every normalisation."""
    credit: CreditMode = "leaf"
    """Which return each generated token trains on (`advantages.compute_advantages`): "leaf", the
    row's reward on all its turns (AReaL's rule), or "turn", the discounted return of the turn that
    generated it (the rows' `turn_returns`; docs/concepts/credit.md)."""
    # "leaf" stays the default until the credit experiment (benchmarks/credit_experiment.py) has
    # been run and decides.
    credit_norm: CreditNorm = "turn"
    """With credit "turn" and reward_norm "group": the group baseline per turn index ("turn") or
    over whole episodes ("episode")."""
    kl_ctl: Annotated[float, Field(ge=0)] = 0.0
    """The weight of the KL-to-reference penalty folded into the token rewards; 0: no reference model."""
    kl_estimator: _KlEstimator = "k1"
    """The KL estimate: "k1", "k2" or "k3"."""
    # log-probabilities
    use_decoupled_loss: bool = False
    """The behaviour-weighted (decoupled) PPO loss: stale tokens are weighted by π_prox/π_behave,
    so rollouts that ran ahead of training stay correct."""
    behave_imp_weight_cap: Annotated[float | None, Field(gt=1)] = 5.0
    """With the decoupled loss: tokens whose π_prox/π_behave is above it are masked (> 1); None: no cap."""
    recompute_logprob: bool = True
    """Recompute the log-probs with the current weights before updating (π_old), rather than
    trusting the engine's."""
    replay_sampling_masks: bool = False
    """Train on the distribution the engine sampled from (`sampling_replay.py`): at tokens drawn
    under a mask (grammar, top-k, top-p) π_θ is renormalised over the recorded allowed set and
    π_behave is the recorded log-prob under that set. False: full-vocabulary log-probs."""
    skip_redundant_recompute: bool = True
    """Skip that separate no-grad pass when the training forward computes the same values: with
    one optimizer step per train step (ppo_n_minibatches == 1) every micro-batch's forward runs
    the pre-update weights, i.e. π_prox itself, so its detached log-probs are used (exact, for
    on- and off-policy tokens alike). Not skipped without the decoupled loss when kl_ctl > 0
    (the KL penalty needs π_old before the forward). Where the separate pass would run, the
    embedded engine's record is used instead when it is exactly π_prox (`Actor(engine_numerics=)`,
    `engine_numerics.py`; stats: `prox_from_engine`). False: always recompute (and compare)."""
    pack: bool = True
    """Train on unique tokens: the rows of a group are merged into a token trie and each shared
    prefix (the group's prompt, earlier turns of concat rows) is computed once (`packing.py`);
    False runs every right-padded row through the model."""
    tree_attention: bool = True
    """How the packed tries run (`packing.py`): True lays all rows' trie out as one flat sequence
    and computes attention only between each node and its ancestors (`tree_attention.py`; for
    models on the Hugging Face attention interface, with full attention: others fall back), and
    the LM head only where the loss reads log-probs; False runs one sequence per group with a
    dense tree mask (attention over every pair of a group's nodes)."""
    last_layer_at_heads: bool = True
    """In that flat layout, run the last decoder layer's queries, attention output and MLP only at
    the nodes whose logits the loss reads (`head_forward.py`; Qwen2/Llama layouts, not under
    FSDP): every other node needs only its keys and values there. Same values; False runs the
    whole last layer (the A/B baseline of benchmarks/train_tokens.py)."""
    parallel: _ParallelMode = "ddp"
    """Under torchrun (WORLD_SIZE > 1): "ddp" keeps a full replica of the model and Adam state on
    every rank; "fsdp" shards them over the ranks (FSDP2 `fully_shard`, per decoder layer), for
    models whose weights + gradients + Adam state do not fit one GPU. Ignored in one process."""
    lora: LoraConfig | None = None
    """LoRA (`LoraConfig`, `lora.py`): {r, alpha, target_modules} trains low-rank adapters
    on the frozen base instead of every weight; the KL reference is the base with the adapters
    off. None: full fine-tuning."""

    def __post_init__(self) -> None:
        from .algorithms import check_algorithm, resolve_preset

        resolve_preset(self)  # the preset's values where a knob is None
        assert self.eps_clip is not None, "every preset sets eps_clip"
        check_algorithm(self)  # the checks that tie knobs together

    def lr_at(self, step: int) -> float:
        """Learning rate of train step `step` (0-based).

        Warm-up: lr·(step+1)/(warmup+1) for the first `lr_warmup_steps` steps. Then "linear" or
        "cosine" decay from lr to min_lr_ratio·lr over the remaining steps of `lr_decay_steps`,
        and min_lr_ratio·lr after that; "constant" stays at lr.
        """
        if step < self.lr_warmup_steps:
            return self.lr * (step + 1) / (self.lr_warmup_steps + 1)
        if self.lr_schedule == "constant":
            return self.lr
        if self.lr_decay_steps is None:
            raise ConfigError(
                f"lr_schedule={self.lr_schedule!r} needs lr_decay_steps (the run's length in steps)"
            )
        span = max(self.lr_decay_steps - self.lr_warmup_steps, 1)
        progress = min((step - self.lr_warmup_steps) / span, 1.0)
        if self.lr_schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay)

    @property
    def computes_prox_logprobs(self) -> bool:
        """Whether the trainer recomputes log-probs with the current weights before updating."""
        return self.use_decoupled_loss or self.recompute_logprob

"""`GRPOConfig`: every knob of one GRPO/PPO training step (defaults follow AReaL's actor)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from areal_nb.api import CREDIT_MODES, CREDIT_NORMS, CreditMode, CreditNorm

from .lora import LoraConfig

LR_SCHEDULES = ("constant", "linear", "cosine")
PARALLEL_MODES = ("ddp", "fsdp")


@dataclass
class GRPOConfig:
    # optimizer
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # <= 0 disables gradient clipping
    # learning-rate schedule over train steps (one train step = ppo_n_minibatches optimizer steps)
    lr_schedule: str = "constant"  # "constant" | "linear" | "cosine" (decay after warm-up)
    lr_warmup_steps: int = 0  # linear warm-up from lr/(warmup+1)
    lr_decay_steps: int | None = None  # steps to reach min_lr_ratio*lr; None: the Session's total_steps
    min_lr_ratio: float = 0.0
    # The algorithm (`algorithms.py`): a preset of the knobs below marked "preset", each of which
    # an explicit value overrides (None: the preset's value, filled in when the config is made).
    algorithm: str = "grpo"  # grpo | dr_grpo | dapo | gspo | cispo | rloo | reinforce_pp
    adv_estimator: str | None = None  # preset: grpo | dr_grpo | rloo | reinforce_pp (adv_estimators.py)
    loss_agg: str | None = None  # preset: token_mean | seq_mean_token_mean | seq_sum_norm (policy_loss.py)
    loss_agg_constant: int | None = None  # seq_sum_norm's divisor; None: the batch's longest generated row
    importance_level: str | None = None  # preset: token (PPO) | sequence (GSPO's geometric mean)
    policy_loss: str | None = None  # preset: ppo | cispo
    dynamic_sampling: bool | None = None  # preset: drop groups whose rewards are all equal, refill
    dynamic_sampling_max_rounds: int = 3  # extra rollouts at most per step to refill the batch
    overlong_max_len: int | None = None  # DAPO's soft overlong penalty: L_max in generated tokens (None: off)
    overlong_buffer: int | None = None  # ... and L_cache; None: a fifth of L_max
    overlong_penalty: float = 1.0  # ... the penalty at and beyond L_max
    # Train-inference mismatch (`mismatch.py`): engine log-probs vs the trainer's recomputation
    mismatch_correction: str | None = None  # None | "tis" (truncate the weight) | "mis" (mask)
    mismatch_level: str = "token"  # "token" | "sequence"
    mismatch_threshold: float = 2.0  # weight above it: truncated to it (tis) or masked (mis)
    # PPO objective
    eps_clip: float | None = None  # preset (grpo: 0.2)
    eps_clip_higher: float | None = None  # preset (grpo: None, symmetric clipping)
    c_clip: float | None = None  # dual clip for negative advantages; must be > 1
    ppo_n_minibatches: int = 1  # optimizer steps per train_step
    micro_batch_size: int | None = None  # rows per forward/backward; None: whole minibatch
    # Tokens per forward/backward (the rows' tokens, prompt included): consecutive rows of a
    # minibatch join a micro-batch while their tokens stay within it (a longer row runs alone).
    # Bounds activation memory whatever the rows' lengths. None: no token limit.
    max_tokens_per_microbatch: int | None = None
    # Recompute each decoder layer's activations in the backward instead of keeping them
    # (torch.utils.checkpoint per layer): activation memory ~1/layers for ~1/3 more compute.
    gradient_checkpointing: bool = False
    # The LM head and log-softmax run this many tokens at a time, forward and backward
    # (`lm_head.py`): no float32 [tokens, vocab] tensor larger than one chunk. 0: all at once.
    logprob_chunk_size: int = 1024
    # rewards and advantages
    reward_scaling: float = 1.0
    reward_bias: float = 0.0
    reward_clip: float = 20.0
    reward_norm: str | None = "group"  # "group" (GRPO) | "batch" | None
    adv_norm: str | None = None  # "batch" | None
    norm_eps: float = 1e-5
    # Which return each generated token trains on (see `advantages.compute_advantages`): "leaf",
    # the row's reward on all its turns (AReaL's rule), or "turn", the discounted return of the
    # turn that generated it (rows' `turn_returns`). "leaf" stays the default until the credit
    # experiment (benchmarks/credit_experiment.py) has been run and decides.
    credit: CreditMode = "leaf"
    credit_norm: CreditNorm = "turn"  # credit="turn", reward_norm="group": per turn index | whole episode
    kl_ctl: float = 0.0  # KL-to-reference penalty folded into the token rewards
    kl_estimator: str = "k1"  # "k1" | "k2" | "k3"
    # log-probabilities
    use_decoupled_loss: bool = False
    behave_imp_weight_cap: float | None = 5.0  # tokens with pi_prox/pi_behave above it are masked
    temperature: float = 1.0  # must equal the sampling temperature
    recompute_logprob: bool = True
    # Train on the distribution the engine sampled from (`sampling_replay.py`): at tokens drawn
    # under a mask (grammar, top-k, top-p) π_θ is renormalised over the recorded allowed set and
    # π_behave is the recorded log-prob under that set. False: full-vocabulary log-probs.
    replay_sampling_masks: bool = False
    # Skip that separate no-grad pass when the training forward computes the same values: with
    # one optimizer step per train step (ppo_n_minibatches == 1) every micro-batch's forward runs
    # the pre-update weights, i.e. π_prox itself, so its detached log-probs are used (exact, for
    # on- and off-policy tokens alike). Not skipped without the decoupled loss when kl_ctl > 0
    # (the KL penalty needs π_old before the forward). False: always recompute.
    skip_redundant_recompute: bool = True
    # Train on unique tokens: the rows of a group are merged into a token trie and each shared
    # prefix (the group's prompt, earlier turns of concat rows) is computed once
    # (`packing.py`); False runs every right-padded row through the model.
    pack: bool = True
    # How the packed tries run (`packing.py`): True lays all rows' trie out as one flat sequence
    # and computes attention only between each node and its ancestors (`tree_attention.py`; for
    # models on the Hugging Face attention interface, with full attention: others fall back),
    # and the LM head only where the loss reads log-probs; False runs one sequence per group with
    # a dense tree mask (attention over every pair of a group's nodes).
    tree_attention: bool = True
    # In that flat layout, run the last decoder layer's queries, attention output and MLP only at
    # the nodes whose logits the loss reads (`head_forward.py`; Qwen2/Llama layouts, not under
    # FSDP): every other node needs only its keys and values there. Same values; False runs the
    # whole last layer (the A/B baseline of benchmarks/train_tokens.py).
    last_layer_at_heads: bool = True
    # Under torchrun (WORLD_SIZE > 1): "ddp" keeps a full replica of the model and Adam state on
    # every rank; "fsdp" shards them over the ranks (FSDP2 `fully_shard`, per decoder layer), for
    # models whose weights + gradients + Adam state do not fit one GPU. Ignored in one process.
    parallel: str = "ddp"
    # LoRA (`lora.py`): {r, alpha, dropout, target_modules} trains low-rank adapters on the frozen
    # base instead of every weight; the KL reference is the base with the adapters off. None: full.
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives lists
        if isinstance(
            self.lora, dict
        ):  # (a plain GRPOConfig(lora={...}) call; the Session's config converts it)
            self.lora = LoraConfig(**self.lora)
        from .algorithms import check_algorithm, resolve_preset

        resolve_preset(self)  # the preset's values where a knob is None
        check_algorithm(self)
        checks = [
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.eps_clip > 0, f"eps_clip must be > 0, got {self.eps_clip}"),
            (
                self.eps_clip_higher is None or self.eps_clip_higher > 0,
                f"eps_clip_higher must be > 0 or None, got {self.eps_clip_higher}",
            ),
            (self.c_clip is None or self.c_clip > 1, f"c_clip must be > 1 or None, got {self.c_clip}"),
            (self.ppo_n_minibatches >= 1, f"ppo_n_minibatches must be >= 1, got {self.ppo_n_minibatches}"),
            (
                self.micro_batch_size is None or self.micro_batch_size >= 1,
                f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}",
            ),
            (
                self.max_tokens_per_microbatch is None or self.max_tokens_per_microbatch >= 1,
                f"max_tokens_per_microbatch must be >= 1 or None, got {self.max_tokens_per_microbatch}",
            ),
            (self.logprob_chunk_size >= 0, f"logprob_chunk_size must be >= 0, got {self.logprob_chunk_size}"),
            (self.reward_clip > 0, f"reward_clip must be > 0, got {self.reward_clip}"),
            (
                self.reward_norm in (None, "group", "batch"),
                f"reward_norm must be 'group', 'batch' or None, got {self.reward_norm!r}",
            ),
            (self.credit in CREDIT_MODES, f"credit must be one of {list(CREDIT_MODES)}, got {self.credit!r}"),
            (
                self.credit_norm in CREDIT_NORMS,
                f"credit_norm must be one of {list(CREDIT_NORMS)}, got {self.credit_norm!r}",
            ),
            (self.adv_norm in (None, "batch"), f"adv_norm must be 'batch' or None, got {self.adv_norm!r}"),
            (self.kl_ctl >= 0, f"kl_ctl must be >= 0, got {self.kl_ctl}"),
            (
                self.kl_estimator in ("k1", "k2", "k3"),
                f"kl_estimator must be 'k1', 'k2' or 'k3', got {self.kl_estimator!r}",
            ),
            (
                self.behave_imp_weight_cap is None or self.behave_imp_weight_cap > 1,
                f"behave_imp_weight_cap must be > 1 or None, got {self.behave_imp_weight_cap}",
            ),
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (
                self.lr_schedule in LR_SCHEDULES,
                f"lr_schedule must be one of {list(LR_SCHEDULES)}, got {self.lr_schedule!r}",
            ),
            (self.lr_warmup_steps >= 0, f"lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}"),
            (
                self.lr_decay_steps is None or self.lr_decay_steps >= 1,
                f"lr_decay_steps must be >= 1 or None, got {self.lr_decay_steps}",
            ),
            (
                self.parallel in PARALLEL_MODES,
                f"parallel must be one of {list(PARALLEL_MODES)}, got {self.parallel!r}",
            ),
            (0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")

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
            raise ValueError(
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

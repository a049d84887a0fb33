"""`GRPOConfig`: every knob of one GRPO/PPO training step (defaults follow AReaL's actor)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GRPOConfig:
    # optimizer
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # <= 0 disables gradient clipping
    # PPO objective
    eps_clip: float = 0.2
    eps_clip_higher: float | None = None  # None: symmetric clipping
    c_clip: float | None = None  # dual clip for negative advantages; must be > 1
    ppo_n_minibatches: int = 1  # optimizer steps per train_step
    micro_batch_size: int | None = None  # rows per forward/backward; None: whole minibatch
    # rewards and advantages
    reward_scaling: float = 1.0
    reward_bias: float = 0.0
    reward_clip: float = 20.0
    reward_norm: str | None = "group"  # "group" (GRPO) | "batch" | None
    adv_norm: str | None = None  # "batch" | None
    norm_eps: float = 1e-5
    kl_ctl: float = 0.0  # KL-to-reference penalty folded into the token rewards
    kl_estimator: str = "k1"  # "k1" | "k2" | "k3"
    # log-probabilities
    use_decoupled_loss: bool = False
    behave_imp_weight_cap: float | None = 5.0  # tokens with pi_prox/pi_behave above it are masked
    temperature: float = 1.0  # must equal the sampling temperature
    recompute_logprob: bool = True

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives lists
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
            (self.reward_clip > 0, f"reward_clip must be > 0, got {self.reward_clip}"),
            (
                self.reward_norm in (None, "group", "batch"),
                f"reward_norm must be 'group', 'batch' or None, got {self.reward_norm!r}",
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
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")

    @property
    def computes_prox_logprobs(self) -> bool:
        """Whether the trainer recomputes log-probs with the current weights before updating."""
        return self.use_decoupled_loss or self.recompute_logprob

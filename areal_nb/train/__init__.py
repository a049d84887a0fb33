"""GRPO training: advantages, the PPO actor loss, log-prob recomputation, the Actor."""

from areal_nb.api.train_batch import TrainBatch

from .actor import Actor
from .advantages import RewardShaping, compute_advantages, group_normalize, kl_estimate
from .config import GRPOConfig
from .inspection import LossInspection
from .logprobs import compute_token_logprobs, compute_token_logprobs_and_entropy, logits_to_token_logprobs
from .loss import LossTerms, ppo_actor_loss, ppo_loss_terms

__all__ = [
    "Actor",
    "GRPOConfig",
    "LossInspection",
    "LossTerms",
    "RewardShaping",
    "TrainBatch",
    "compute_advantages",
    "compute_token_logprobs",
    "compute_token_logprobs_and_entropy",
    "group_normalize",
    "kl_estimate",
    "logits_to_token_logprobs",
    "ppo_actor_loss",
    "ppo_loss_terms",
]

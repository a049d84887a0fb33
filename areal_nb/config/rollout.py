"""`rollout`: how many episodes each training step gets, and how they are sampled."""

from __future__ import annotations

from pydantic import Field

from areal_nb.api import MAX_TEMPERATURE, MIN_TEMPERATURE

from .section import Section


class RolloutConfig(Section):
    """`rollout`: how many episodes each training step gets, and how they are sampled."""

    batch_size: int = Field(16, ge=1)
    """Prompts per training step."""
    group_size: int = Field(4, ge=1)
    """Samples per prompt (a GRPO group)."""
    max_head_offpolicyness: int = Field(2, ge=0)
    """How many policy versions a trained token may lag behind (0: on-policy)."""
    max_concurrent_rollouts: int = Field(64, ge=1)
    """Episodes in flight at once (at least `group_size`: a group starts all its samples together)."""
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    """The sampling temperature the proxy uses when an agent's request leaves it out (agents
    normally do), and the one the trainer recomputes log-probs at. Above 0, since the log-probs of a greedy
    policy are degenerate for RL; below MIN_TEMPERATURE logits / T overflows float32 and the
    engine refuses the request."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling, when a request leaves it out."""
    max_new_tokens: int = Field(16, ge=1)
    """Tokens generated per call, when a request leaves it out."""
    prefetch: bool = True
    """run() keeps rollouts going while training, within the staleness bound."""
    gil_switch_interval: float | None = Field(2e-4, gt=0, le=1)
    """Python's GIL switch interval (seconds) while episodes are in flight, restored after: the
    engine thread gets the GIL back after each torch op within this time instead of Python's
    5 ms (areal_nb/rollout/switch_interval.py). Process-wide while it lasts; None: leave it."""

"""A session's export, in one place: `/export_trajectories` and the in-process client both call it.

Two results from the same calls:

- `session_calls`: every completed call of the session with the rewards as the agent set them
  (unset: None; `raw_reward` holds the same value, unset: 0.0). The Session trains on these: its `RolloutBatch` alone discounts the rewards,
  assigns credit and picks the export style, so a reward is discounted exactly once.
- `discounted_calls`: what `/export_trajectories` documents for external consumers (AReaL's
  export): the same calls with the rewards discounted back through the turns (the cache's
  one-shot discount; `cache.undo_reward_discount()` puts the agent's rewards back) and, with
  style `concat`, only the leaves of each tree. Each call keeps the agent's value in `raw_reward`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_nb.api import DiscountMode, ExportStyle, check_export_style

from .state import SessionData

if TYPE_CHECKING:
    from areal_nb.capture import InteractionWithTokenLogpReward

__all__ = ["discounted_calls", "session_calls"]


def session_calls(session: SessionData) -> dict[str, InteractionWithTokenLogpReward]:
    """The session's completed calls, parents before children, rewards untouched; each call's
    `raw_reward` holds the agent's reward (unset: the 0.0 a discount counts), as
    `/export_trajectories` records it."""
    cache = session.cache
    if len(cache):
        cache.warn_unrewarded_leaves()  # as the discount of `/export_trajectories` does
    calls = cache.export_interactions("individual") if len(cache) else {}
    for call in calls.values():
        call.raw_reward = call.reward if call.reward is not None else 0.0
    return calls


def discounted_calls(
    session: SessionData, discount: float, style: ExportStyle, discount_mode: DiscountMode
) -> dict[str, InteractionWithTokenLogpReward]:
    """The session's calls as `/export_trajectories` returns them: discounted, then by `style`."""
    cache = session.cache
    if len(cache) == 0:
        return {}
    # Checked before the one-shot discount so a wrong style loses nothing.
    check_export_style(style, {iid: it.chat_template_type for iid, it in cache.items()})
    cache.apply_reward_discount(discount, mode=discount_mode)
    return cache.export_interactions(style)

"""`InteractionCache`: the calls of one session, linked into conversation trees.

Differences from AReaL (docs/reference/areal-semantics.md, "Rewards and the discount"):
`set_last_reward` targets the most recently
*completed* call; rewards are validated (int ok, bool not); the default reward discount works per
tree branch (`mode="tree"`), while `mode="linear"` reproduces AReaL's reverse-insertion-order
discount for porting runs.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from areal_nb.api import DISCOUNT_MODES, DiscountMode, ExportStyle, check_export_style
from areal_nb.errors import (  # noqa: F401 (the warnings are re-exported)
    ArgumentTypeError,
    CallOrderError,
    ConversationLinkWarning,
    ExportError,
    IncompleteInteractionError,
    IncompleteInteractionWarning,
    InvalidArgumentError,
    MissingRewardWarning,
)

from .interaction import InteractionWithTokenLogpReward, checked_reward
from .messages import is_prefix


class InteractionCache(OrderedDict[str, InteractionWithTokenLogpReward]):
    """Ordered store of interactions keyed by interaction (completion/response) id.

    Insertion resolves the new call's parent: the earlier *completed* call whose messages plus
    output messages are the longest prefix of the new call's messages.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._completed_order: list[str] = []
        self._discount_applied = False
        self._rewards_before_discount: dict[str, tuple[float | None, float | None]] = {}

    def __deepcopy__(self, memo: dict) -> InteractionCache:
        if len(self):
            raise ArgumentTypeError("a non-empty InteractionCache cannot be deep-copied")
        return InteractionCache()

    # ----- insertion and parents ----------------------------------------------------------
    def __setitem__(self, key: str, value: InteractionWithTokenLogpReward) -> None:
        self.insert(key, value)

    def insert(self, key: str, value: InteractionWithTokenLogpReward, resolve_parent: bool = True) -> None:
        """Add `value` under `key`; its parent is resolved unless already set or not wanted."""
        if not isinstance(value, InteractionWithTokenLogpReward):
            raise ArgumentTypeError(
                f"InteractionCache values must be InteractionWithTokenLogpReward, got {type(value).__name__}"
            )
        if value.messages is None:
            raise InvalidArgumentError("interaction messages must be set before it is cached")
        with self._lock:
            if key in self:
                raise InvalidArgumentError(f"interaction {key!r} is already in the cache")
            if value.parent is None and resolve_parent:
                value.parent = self.find_parent(value.messages, value.agent)
            super().__setitem__(key, value)
            if value.is_complete:
                self._completed_order.append(key)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            super().__delitem__(key)
            if key in self._completed_order:
                self._completed_order.remove(key)

    def find_parent(
        self, messages: list[dict[str, Any]], agent: str | None = None
    ) -> InteractionWithTokenLogpReward | None:
        """The completed call of the same `agent` whose messages + outputs are the longest prefix
        of `messages`. Another agent's call is never a parent: a checker shown the solver's
        conversation starts a tree of its own, so no reward flows between agents' turns."""
        best: InteractionWithTokenLogpReward | None = None
        best_len = -1
        near_miss: InteractionWithTokenLogpReward | None = None
        with self._lock:
            candidates = list(self.values())
        for candidate in candidates:
            if not candidate.is_complete or candidate.agent != agent or candidate.is_text_completion:
                continue  # in-flight calls, other agents' calls and text completions are never parents
            history = candidate.messages + (candidate.output_message_list or [])
            if is_prefix(history, messages):
                if len(history) > best_len:
                    best, best_len = candidate, len(history)
            elif _edited_assistant_continuation(candidate, messages):
                near_miss = candidate
        if best is None and near_miss is not None:
            warnings.warn(
                f"this call continues the conversation of interaction {near_miss.interaction_id}, "
                "but the assistant message it sent back differs from what the model returned, so "
                "it is not linked as a child. Append the returned message unchanged "
                "(`choices[0].message` or `.model_dump()`; for Responses the `output` items).",
                ConversationLinkWarning,
                stacklevel=3,
            )
        return best

    def snapshot(self) -> list[InteractionWithTokenLogpReward]:
        """The interactions now, in insertion order: a list to iterate while calls insert."""
        with self._lock:
            return list(self.values())

    def mark_completed(self, key: str) -> None:
        """Record that the call `key` returned (it becomes a parent and reward candidate)."""
        with self._lock:
            interaction = self[key]
            if not interaction.is_complete:
                raise IncompleteInteractionError(f"interaction {key!r} has no output yet")
            if key not in self._completed_order:
                self._completed_order.append(key)

    # ----- rewards ------------------------------------------------------------------------
    @property
    def last_interaction_id(self) -> str | None:
        """The most recently *completed* interaction (not the most recently started)."""
        return self._last_completed(lambda interaction: True)

    def last_interaction_id_of(self, agent: str | None) -> str | None:
        """The most recently completed interaction of `agent` (the `model` its calls sent)."""
        return self._last_completed(lambda interaction: interaction.agent == agent)

    def _last_completed(self, keep: Callable[[InteractionWithTokenLogpReward], bool]) -> str | None:
        with self._lock:
            for key, value in self.items():  # complete entries filled in by hand
                if value.is_complete and key not in self._completed_order:
                    self._completed_order.append(key)
            for key in reversed(self._completed_order):
                if key in self and self[key].is_complete and keep(self[key]):
                    return key
            return None

    @property
    def total_reward(self) -> float:
        return sum(v.reward for v in self.values() if v.reward is not None)

    def set_reward(self, interaction_id: str, reward: float) -> None:
        value = checked_reward(reward)
        with self._lock:
            if interaction_id not in self:
                raise KeyError(f"Interaction with ID {interaction_id} not found in cache")
            self[interaction_id].reward = value

    def set_last_reward(self, reward: float) -> str:
        """Set the reward of the most recently completed call; returns its id."""
        key = self.last_interaction_id
        if key is None:
            raise CallOrderError("No completed interaction in cache to set a reward on")
        self.set_reward(key, reward)
        return key

    def apply_reward_discount(
        self, turn_discount: float = 1.0, mode: DiscountMode = "tree"
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """Propagate rewards back through the turns, once.

        `mode="tree"`: leaves first, a call's reward becomes its own reward plus
        `turn_discount` times the mean of its children's propagated rewards; separate trees
        never exchange reward. `mode="linear"`: AReaL's rule over reverse insertion order,
        `r[i] += turn_discount * r[i+1]`. Unset rewards count as 0.0.
        """
        if mode not in DISCOUNT_MODES:
            raise InvalidArgumentError(
                f"Invalid reward discount mode {mode!r}; expected one of {DISCOUNT_MODES}"
            )
        if isinstance(turn_discount, bool) or not isinstance(turn_discount, int | float):
            raise ArgumentTypeError(f"turn_discount must be a number, got {turn_discount!r}")
        with self._lock:
            if self._discount_applied:
                raise CallOrderError("apply_reward_discount should only be called once.")
            self._discount_applied = True
            self._rewards_before_discount = {k: (v.reward, v.raw_reward) for k, v in self.items()}
            if mode == "linear":
                self._discount_linear(float(turn_discount))
            else:
                self._discount_tree(float(turn_discount))
            return dict(self)

    def _discount_linear(self, gamma: float) -> None:
        values = list(self.values())
        if values and values[-1].reward is None:
            warnings.warn(
                "The most recent interaction does not have a reward set; using 0.0",
                MissingRewardWarning,
                stacklevel=4,
            )
        self._store_discounted(values, discounted_rewards(values, gamma, "linear"))

    def _discount_tree(self, gamma: float) -> None:
        nodes = [v for v in self.values() if v.is_complete]
        self.warn_unrewarded_leaves(stacklevel=5)
        self._store_discounted(nodes, discounted_rewards(nodes, gamma, "tree"))

    def warn_unrewarded_leaves(self, stacklevel: int = 4) -> None:
        """`MissingRewardWarning` when a conversation's last call (a leaf of its tree) has no
        reward: a discount counts it 0.0, which is rarely what the agent meant."""
        nodes = [v for v in self.values() if v.is_complete]
        parents = {id(v.parent) for v in nodes if v.parent is not None}
        unset = [v.interaction_id for v in nodes if id(v) not in parents and v.reward is None]
        if unset:
            warnings.warn(
                f"{len(unset)} leaf interaction(s) have no reward set ({', '.join(map(str, unset[:3]))}"
                f"{', ...' if len(unset) > 3 else ''}); using 0.0",
                MissingRewardWarning,
                stacklevel=stacklevel,
            )

    def undo_reward_discount(self) -> None:
        """Put back the rewards as the agent set them, so the discount can be applied again.

        For an export that failed or was abandoned after the discount: the session must stay
        exportable with the same result.
        """
        with self._lock:
            if not self._discount_applied:
                return
            for key, (reward, raw_reward) in self._rewards_before_discount.items():
                if key in self:
                    self[key].reward, self[key].raw_reward = reward, raw_reward
            self._discount_applied = False

    @staticmethod
    def _store_discounted(
        interactions: list[InteractionWithTokenLogpReward], rewards: dict[str | None, float]
    ) -> None:
        for v in interactions:
            # As the agent set it; an unset reward is recorded as the 0.0 the discount counted,
            # so readers of raw_reward (episode returns, re-export) never fall back to `reward`,
            # which now holds the discounted value (a tool-call turn's 0.9, say).
            v.raw_reward = v.reward if v.reward is not None else 0.0
            v.reward = rewards[v.interaction_id]

    # ----- export -------------------------------------------------------------------------
    def export_interactions(
        self, style: ExportStyle = "individual", reward_discount: float | None = None
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """Completed calls: all of them (`individual`) or the leaves of each tree (`concat`)."""
        check_export_style(style)
        if reward_discount is not None and not self._discount_applied:
            self.apply_reward_discount(reward_discount)
        with self._lock:
            complete = {}
            skipped = []
            for key, value in self.items():
                if not value.is_complete:
                    skipped.append(key)
                    continue
                if key != value.interaction_id:
                    raise ExportError(
                        f"Interaction ID mismatch: cached under {key!r} but its id is {value.interaction_id!r}"
                    )
                complete[key] = value
        if skipped:
            warnings.warn(
                f"skipping {len(skipped)} interaction(s) that have not returned: {', '.join(skipped)}",
                IncompleteInteractionWarning,
                stacklevel=2,
            )
        if style == "individual":
            return complete
        check_export_style(style, {k: v.chat_template_type for k, v in complete.items()})
        parents = {id(v.parent) for v in complete.values() if v.parent is not None}
        return {k: v for k, v in complete.items() if id(v) not in parents}


def discounted_rewards(
    interactions: list[InteractionWithTokenLogpReward],
    turn_discount: float,
    mode: DiscountMode = "tree",
    rewards: Mapping[str | None, float | None] | None = None,
) -> dict[str | None, float]:
    """Rewards after discount keyed by interaction id, computed without changing anything.

    `interactions` in insertion order; `rewards` overrides their own (e.g. the raw rewards of
    an already discounted episode). Unset rewards count as 0.0. `tree`: each call gets its own
    reward plus `turn_discount` × the mean of its children's discounted rewards (children are
    the calls in `interactions` whose parent it is); `linear`: reverse insertion order,
    `r[i] += turn_discount * r[i+1]`.
    """
    if mode not in DISCOUNT_MODES:
        raise InvalidArgumentError(f"Invalid reward discount mode {mode!r}; expected one of {DISCOUNT_MODES}")

    def own(v: InteractionWithTokenLogpReward) -> float:
        r = rewards.get(v.interaction_id, v.reward) if rewards is not None else v.reward
        return 0.0 if r is None else float(r)

    out: dict[str | None, float] = {}
    if mode == "linear":
        current = 0.0
        for v in reversed(interactions):
            current = current * turn_discount + own(v)
            out[v.interaction_id] = current
        return out
    members = {id(v) for v in interactions}
    children: dict[int, list[InteractionWithTokenLogpReward]] = {id(v): [] for v in interactions}
    for v in interactions:
        if v.parent is not None and id(v.parent) in members:
            children[id(v.parent)].append(v)
    propagated: dict[int, float] = {}
    for v in sorted(interactions, key=lambda n: n.depth, reverse=True):  # children before parents
        value = own(v)
        kids = children[id(v)]
        if kids:
            value += turn_discount * sum(propagated[id(k)] for k in kids) / len(kids)
        propagated[id(v)] = value
        out[v.interaction_id] = value
    return out


def _edited_assistant_continuation(
    candidate: InteractionWithTokenLogpReward, messages: list[dict[str, Any]]
) -> bool:
    """Whether `messages` continue `candidate` except for a changed assistant message."""
    n_in, outputs = len(candidate.messages), candidate.output_message_list or []
    if not is_prefix(candidate.messages, messages) or len(messages) < n_in + len(outputs):
        return False
    sent = messages[n_in : n_in + len(outputs)]
    return any(m.get("role") == "assistant" for m in sent) and not is_prefix(outputs, sent)

"""Reward propagation recomputed without touching the data: any discount, either mode.

`discounted_rewards` follows `InteractionCache.apply_reward_discount` exactly (tests compare
the two on real episodes) but works on a copy of the rewards, so a slider can move freely.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .sources import collect_interactions, is_complete, node_key, raw_reward
from .tree_model import TreeModel, build_tree

MODES = ("tree", "linear")
STYLES = ("concat", "individual")


def discounted_rewards(
    interactions: list[Any], raw: Mapping[int, float | None], gamma: float, mode: str = "tree"
) -> dict[int, float]:
    """Rewards after discount, keyed by `id(interaction)`; unset rewards count as 0.0.

    tree: a call gets its own reward plus `gamma` × the mean of its children's results;
    linear: reverse insertion order, `r[i] += gamma * r[i+1]` (AReaL's rule).
    """
    if mode not in MODES:
        raise ValueError(f"discount mode must be one of {MODES}, got {mode!r}")
    if not 0.0 <= gamma <= 1.0 or math.isnan(gamma):
        raise ValueError(f"discount must be in [0, 1], got {gamma}")
    own = {id(x): (raw.get(id(x)) or 0.0) for x in interactions}
    out: dict[int, float] = {}
    if mode == "linear":
        current = 0.0
        for x in reversed(interactions):
            current = current * gamma + own[id(x)]
            out[id(x)] = current
        return out
    nodes = [x for x in interactions if is_complete(x)]
    members = {id(x) for x in nodes}
    children: dict[int, list[Any]] = {id(x): [] for x in nodes}
    for x in nodes:
        if x.parent is not None and id(x.parent) in members:
            children[id(x.parent)].append(x)
    for x in sorted(nodes, key=_depth, reverse=True):
        kids = children[id(x)]
        value = own[id(x)]
        if kids:
            value += gamma * sum(out[id(k)] for k in kids) / len(kids)
        out[id(x)] = value
    return out


def _depth(x: Any) -> int:
    n, node = 0, x.parent
    while node is not None:
        n, node = n + 1, node.parent
    return n


def group_normalised(rewards: list[float], eps: float = 1e-5) -> list[float]:
    """GRPO advantages: (r − group mean) / (unbiased group std + eps); one row → std 1."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    if len(rewards) > 1:
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    else:
        std = 1.0
    return [(r - mean) / (std + eps) for r in rewards]


@dataclass
class RewardNode:
    id: str
    episode: int  # index of the episode in the group
    raw: float | None
    discounted: float
    exported: bool  # a training row in the chosen export style


@dataclass
class AdvantageRow:
    interaction_id: str
    episode: int
    sample_id: int | None
    reward: float
    advantage: float


@dataclass
class RewardViewState:
    gamma: float
    mode: str
    style: str
    raw_recorded: bool  # False: the capture layer kept no pre-discount reward; stored reward used
    nodes: list[RewardNode]
    rows: list[AdvantageRow]
    tree: TreeModel  # the focus episode's tree (layout for drawing)
    focus: int

    def node(self, node_id: str) -> RewardNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)


@dataclass
class RewardSource:
    """The interactions of a group of episodes, with the rewards as they were set."""

    episodes: list[list[Any]]  # interactions per episode, insertion order
    sample_ids: list[int | None]
    raw: dict[int, float | None]
    raw_recorded: bool
    focus: int = 0

    @classmethod
    def from_any(cls, source: Any, focus: int | None = None, group: list[Any] | None = None,
                 raw_rewards: Mapping[str, float] | None = None) -> RewardSource:
        if hasattr(source, "episodes") and not hasattr(source, "interactions"):  # RolloutBatch
            index = focus or 0
            episode = source.episodes[index]
            members = [e for e in source.episodes if getattr(e, "group_id", None) == episode.group_id]
            return cls.from_any(episode, members.index(episode), members, raw_rewards)
        episodes = group if group is not None else [source]
        per_episode = [[x for x in collect_interactions(e) if is_complete(x)] for e in episodes]
        raw: dict[int, float | None] = {}
        recorded = True
        for items in per_episode:
            for x in items:
                if raw_rewards is not None and x.interaction_id in raw_rewards:
                    raw[id(x)] = float(raw_rewards[x.interaction_id])
                elif (value := raw_reward(x)) is not None:
                    raw[id(x)] = value
                else:  # only the stored (possibly already discounted) reward is known
                    raw[id(x)] = x.reward
                    recorded = recorded and x.reward is None
        if focus is None:
            focus = episodes.index(source) if group is not None and source in episodes else 0
        return cls(per_episode, [getattr(e, "sample_id", None) for e in episodes], raw, recorded, focus)


def default_style(src: RewardSource) -> str:
    every = [x for items in src.episodes for x in items]
    return "concat" if every and all(x.chat_template_type == "concat" for x in every) else "individual"


def reward_state(src: RewardSource, gamma: float, mode: str = "tree", style: str | None = None) -> RewardViewState:
    style = style or default_style(src)
    if style not in STYLES:
        raise ValueError(f"export style must be one of {STYLES}, got {style!r}")
    nodes: list[RewardNode] = []
    rows: list[AdvantageRow] = []
    for e, items in enumerate(src.episodes):
        values = discounted_rewards(items, src.raw, gamma, mode)
        parents = {id(x.parent) for x in items if x.parent is not None}
        for i, x in enumerate(items):
            exported = style == "individual" or id(x) not in parents
            nodes.append(RewardNode(node_key(x, i), e, src.raw.get(id(x)), values[id(x)], exported))
            if exported:
                rows.append(AdvantageRow(node_key(x, i), e, src.sample_ids[e], values[id(x)], 0.0))
    for row, adv in zip(rows, group_normalised([r.reward for r in rows]), strict=True):
        row.advantage = adv
    tree = build_tree(src.episodes[src.focus] if src.episodes else [])
    return RewardViewState(gamma, mode, style, src.raw_recorded, nodes, rows, tree, src.focus)

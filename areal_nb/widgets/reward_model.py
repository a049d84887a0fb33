"""Reward propagation recomputed without touching the data: any discount, either mode.

`discounted_rewards` follows `InteractionCache.apply_reward_discount` exactly (tests compare
the two on real episodes) but works on a copy of the rewards, so a slider can move freely.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_nb.api import (
    CREDIT_MODES,
    CREDIT_NORMS,
    DISCOUNT_MODES,
    CreditMode,
    CreditNorm,
    DiscountMode,
    ExportStyle,
    can_export_concat,
    check_export_style,
)
from areal_nb.errors import InvalidArgumentError

from .loss_model import ZERO_ADVANTAGE
from .sources import collect_interactions, is_complete, node_key, raw_reward
from .tree_model import TreeModel, build_tree, node_by_id


def discounted_rewards(
    interactions: list[Any], raw: Mapping[int, float | None], gamma: float, mode: str = "tree"
) -> dict[int, float]:
    """Rewards after discount keyed by `id(interaction)`, computed by the capture layer's rule
    (`areal_nb.capture.cache.discounted_rewards`) from the rewards as set; nothing is changed."""
    from areal_nb.capture.cache import discounted_rewards as capture_discount

    if mode not in DISCOUNT_MODES:
        raise InvalidArgumentError(f"discount mode must be one of {DISCOUNT_MODES}, got {mode!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise InvalidArgumentError(f"discount must be a number in [0, 1], got {gamma!r}")
    by_id = capture_discount(
        interactions, float(gamma), mode, {x.interaction_id: raw.get(id(x)) for x in interactions}
    )
    return {id(x): by_id[x.interaction_id] for x in interactions}


def group_normalised(rewards: list[float], eps: float = 1e-5) -> list[float]:
    """GRPO advantages of one group's rows, by the trainer's rule (`train.advantages.group_normalize`)."""
    if not rewards:
        return []
    import torch

    from areal_nb.train.advantages import group_normalize

    return [
        float(a)
        for a in group_normalize(torch.tensor(rewards, dtype=torch.float64), [0] * len(rewards), eps=eps)
    ]


def _turn_normalised(pairs: list[tuple[int, float]], scope: str = "turn", eps: float = 1e-5) -> list[float]:
    """Turn-credit advantages of one group's (turn index, return) pairs, by the trainer's rule
    (`train.advantages.turn_scores`): pooled per turn index (`scope="turn"`) or all together."""
    if not pairs:
        return []
    import torch

    from areal_nb.train.advantages import group_normalize

    pools = [turn for turn, _ in pairs] if scope == "turn" else [0] * len(pairs)
    values = torch.tensor([v for _, v in pairs], dtype=torch.float64)
    return [float(a) for a in group_normalize(values, pools, eps=eps)]


@dataclass
class RowTurn:
    """One turn of a training row: the return its tokens train on and their advantage."""

    turn: int
    interaction_id: str  # the call that generated it
    n_tokens: int | None  # its trained tokens in this row (None without token data)
    turn_return: float  # that call's own discounted return
    trained_on: float  # leaf credit: the row's reward; turn credit: turn_return
    advantage: float = 0.0

    @property
    def label(self) -> str:
        return f"turn {self.turn}: {self.trained_on:.4g} → {self.advantage:+.4f}"


def _row_turns(row: Any, value_of: Any, credit: str) -> list[RowTurn]:
    """The turns a row trains, root first: the call itself and, in a concat row, its ancestors."""
    calls = list(reversed(row.row_calls())) if hasattr(row, "row_calls") else [row]
    token_row = row.token_row() if getattr(row, "has_tensor_data", False) else None
    out = []
    for position, call in enumerate(calls):
        turn = call.own_turn_id() if getattr(call, "has_tensor_data", False) else position
        if turn is None:  # generated nothing
            continue
        n = None
        if token_row is not None:
            n = sum(
                1 for t, m in zip(token_row.turn_ids, token_row.loss_mask, strict=True) if t == turn and m
            )
        own = value_of(call)
        out.append(
            RowTurn(turn, node_key(call, position), n, own, own if credit == "turn" else value_of(row))
        )
    return out


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
    advantage: float  # leaf credit: the row's; turn credit: its last (own) turn's
    turns: list[RowTurn] = field(default_factory=list)  # per turn: the return trained on, advantage
    agent: str | None = None  # the agent that made the row's call: its baseline is that agent's rows


@dataclass
class RewardViewState:
    gamma: float
    mode: str
    style: str
    nodes: list[RewardNode]  # every call of every episode of the group
    rows: list[AdvantageRow]  # the rows the chosen export style trains on
    tree: TreeModel  # the focus episode's tree (layout for drawing)
    focus: int
    credit: CreditMode = "leaf"
    credit_norm: CreditNorm = "turn"

    @property
    def zero_signal(self) -> bool:
        """Every advantage of the group's rows is 0 (its rewards were all equal): it teaches nothing."""
        values = [a for r in self.rows for a in [r.advantage, *(t.advantage for t in r.turns)]]
        return bool(values) and all(abs(a) <= ZERO_ADVANTAGE for a in values)

    def node(self, node_id: str) -> RewardNode:
        return node_by_id(self.nodes, node_id, "call", "group")


@dataclass
class RewardSource:
    """The completed calls of a group of episodes, with the rewards as they were set."""

    episodes: list[list[Any]]  # calls per episode, insertion order
    sample_ids: list[int | None]
    raw: dict[int, float | None]  # keyed by id(interaction)
    focus: int = 0
    defaults: dict[str, Any] | None = None  # discount / mode / style of the batch it came from

    @classmethod
    def from_any(
        cls,
        source: Any,
        focus: int | None = None,
        group: list[Any] | None = None,
        raw_rewards: Mapping[str, float] | None = None,
    ) -> RewardSource:
        """An episode (and optionally its group), or a RolloutBatch and the index of an episode."""
        if hasattr(source, "episodes") and not hasattr(source, "interactions"):  # RolloutBatch
            index = focus or 0
            if not 0 <= index < len(source.episodes):
                raise IndexError(
                    f"episode index {index} out of range: the batch has {len(source.episodes)} episodes"
                )
            episode = source.episodes[index]
            members = [e for e in source.episodes if getattr(e, "group_id", None) == episode.group_id]
            out = cls.from_any(episode, members.index(episode), members, raw_rewards)
            out.defaults = {
                "discount": getattr(source, "discount", None),
                "mode": getattr(source, "discount_mode", None),
                "style": getattr(source, "style", None),
                "credit": getattr(source, "credit", None),
            }
            return out
        episodes = list(group) if group is not None else [source]
        per_episode = [[x for x in collect_interactions(e) if is_complete(x)] for e in episodes]
        raw: dict[int, float | None] = {}
        for items in per_episode:
            for x in items:
                if raw_rewards is not None and x.interaction_id in raw_rewards:
                    raw[id(x)] = float(raw_rewards[x.interaction_id])
                else:  # `raw_reward` is kept by the capture layer once a discount was applied
                    value = raw_reward(x)
                    raw[id(x)] = value if value is not None else x.reward
        if focus is None:
            focus = next((i for i, e in enumerate(episodes) if e is source), 0)
        return cls(per_episode, [getattr(e, "sample_id", None) for e in episodes], raw, focus)


def _default_style(src: RewardSource) -> ExportStyle:
    every = [x for items in src.episodes for x in items]
    return "concat" if every and can_export_concat(x.chat_template_type for x in every) else "individual"


def reward_state(
    src: RewardSource,
    gamma: float,
    mode: DiscountMode = "tree",
    style: ExportStyle | None = None,
    credit: CreditMode = "leaf",
    credit_norm: CreditNorm = "turn",
) -> RewardViewState:
    """Rewards after discount, the group's rows and, per row and turn, the return each turn's
    tokens train on (`credit`) with its advantage (the trainer's group normalisation)."""
    style = style or _default_style(src)
    check_export_style(style)
    if credit not in CREDIT_MODES:
        raise InvalidArgumentError(f"credit must be one of {CREDIT_MODES}, got {credit!r}")
    if credit_norm not in CREDIT_NORMS:
        raise InvalidArgumentError(f"credit_norm must be one of {CREDIT_NORMS}, got {credit_norm!r}")
    nodes: list[RewardNode] = []
    rows: list[AdvantageRow] = []
    for e, items in enumerate(src.episodes):
        values = discounted_rewards(items, src.raw, gamma, mode)
        parents = {id(x.parent) for x in items if x.parent is not None}
        for i, x in enumerate(items):
            exported = style == "individual" or id(x) not in parents
            nodes.append(RewardNode(node_key(x, i), e, src.raw.get(id(x)), values[id(x)], exported))
            if exported:
                turns = _row_turns(x, lambda c, v=values: v.get(id(c), 0.0), credit)
                agent = getattr(x, "agent", None)
                rows.append(
                    AdvantageRow(node_key(x, i), e, src.sample_ids[e], values[id(x)], 0.0, turns, agent)
                )
    # the trainer's pools are (prompt, agent): each agent's rows are normalised among themselves
    for agent in dict.fromkeys(r.agent for r in rows):
        _normalise([r for r in rows if r.agent == agent], credit, credit_norm)
    tree = build_tree(src.episodes[src.focus] if src.episodes else [])
    return RewardViewState(gamma, mode, style, nodes, rows, tree, src.focus, credit, credit_norm)


def _normalise(rows: list[AdvantageRow], credit: CreditMode, credit_norm: CreditNorm) -> None:
    """Set the advantages of one pool's rows (one agent's rows of the group)."""
    if credit == "leaf":
        for row, adv in zip(rows, group_normalised([r.reward for r in rows]), strict=True):
            row.advantage = adv
            for t in row.turns:
                t.advantage = adv
        return
    pairs = [t for r in rows for t in r.turns]
    for t, adv in zip(
        pairs, _turn_normalised([(t.turn, t.trained_on) for t in pairs], credit_norm), strict=True
    ):
        t.advantage = adv
    for row in rows:
        row.advantage = row.turns[-1].advantage if row.turns else 0.0

"""A train step's per-token loss terms as token chips: what each token did to the update.

Source: a `train.LossInspection` (from `train_step(batch, inspect=True)`) and a tokenizer, or
anything holding both (`session` after `session.train_step(batch, inspect=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from areal_nb.errors import InvalidArgumentError

from .token_model import special_ids, visible_text

# |advantage| at or below this is 0: a group of equal rewards normalises to ~1e-12, not exactly 0
ZERO_ADVANTAGE = 1e-6

LossFilter = Literal["all", "clipped", "capped", "clipped or capped"]
LOSS_FILTERS: tuple[LossFilter, ...] = ("all", "clipped", "capped", "clipped or capped")


@dataclass
class LossChip:
    position: int
    token_id: int
    visible: str
    special: bool
    trained: bool  # in the loss mask
    turn: int  # -1: prompt / gap
    advantage: float
    ratio: float
    clipped: bool
    dual_clipped: bool
    behave_weight: float
    capped: bool  # behaviour weight above the cap: masked out of the loss
    entropy: float
    contribution: float  # share of the minibatch loss
    selected: bool = True  # matches the view's filter

    @property
    def title(self) -> str:
        if not self.trained:
            return f"#{self.position} id={self.token_id} not trained (loss_mask=0)"
        parts = [
            f"#{self.position} id={self.token_id}",
            f"advantage={self.advantage:.4g}",
            f"ratio={self.ratio:.4g}"
            + (" CLIPPED" if self.clipped else "")
            + (" DUAL-CLIPPED" if self.dual_clipped else ""),
            f"behaviour weight={self.behave_weight:.4g}" + (" CAPPED (masked out)" if self.capped else ""),
            f"entropy={self.entropy:.4g}",
            f"loss contribution={self.contribution:.4g}",
            f"turn={self.turn}",
        ]
        return " · ".join(parts)


@dataclass
class LossTurn:
    turn: int
    n_tokens: int
    n_clipped: int
    n_capped: int
    contribution: float  # Σ over the turn's tokens
    advantage_mean: float


@dataclass
class LossRow:
    index: int
    reward: float
    minibatch: int
    chips: list[LossChip]
    turns: list[LossTurn]
    agent: str | None = None  # the agent whose call the row is (several agents only)
    agent_index: int | None = None  # its place in the view's `agents` (its colour)
    # its group's advantages are 0 on every trained token (equal rewards): it teaches nothing
    zero_signal: bool = False

    @property
    def contribution(self) -> float:
        return sum(c.contribution for c in self.chips)

    @property
    def n_clipped(self) -> int:
        return sum(c.clipped for c in self.chips)

    @property
    def n_capped(self) -> int:
        return sum(c.capped for c in self.chips)


@dataclass
class LossViewModel:
    filter: LossFilter
    rows: list[LossRow] = field(default_factory=list)
    n_rows_total: int = 0
    eps_clip: float = 0.2
    behave_imp_weight_cap: float | None = None
    version: int = 0
    agents: list[str | None] = field(default_factory=list)  # several agents: in order of first appearance
    n_zero_signal: int = 0  # rows of the step (shown or not) in groups without signal

    @property
    def loss(self) -> float:
        return sum(r.contribution for r in self.rows)


def _resolve_loss_source(source: Any, tokenizer: Any | None) -> tuple[Any, Any]:
    """(LossInspection, tokenizer) from an inspection or an object holding `last_inspection`."""
    inspection = source
    if not hasattr(source, "contribution"):
        inspection = getattr(source, "last_inspection", None)
        if inspection is None:
            raise InvalidArgumentError("nothing to show: run train_step(batch, inspect=True) first")
        tokenizer = tokenizer if tokenizer is not None else getattr(source, "tokenizer", None)
    if tokenizer is None:
        raise InvalidArgumentError(
            "a LossInspection needs tokenizer=... to decode its tokens (e.g. session.tokenizer)"
        )
    return inspection, tokenizer


def _zero_signal_rows(inspection: Any) -> set[int]:
    """The rows of groups whose every trained token has advantage 0 (their rewards were all equal:
    nothing to learn); an inspection without groups: the rows whose own trained tokens all have."""
    silent = ((inspection.advantages.abs() <= ZERO_ADVANTAGE) | ~inspection.loss_mask.bool()).all(dim=1)
    groups = getattr(inspection, "groups", None)
    if groups is None:
        return {i for i, flag in enumerate(silent.tolist()) if flag}
    groups = groups.tolist()
    loud = {g for g, flag in zip(groups, silent.tolist(), strict=True) if not flag}
    return {i for i, g in enumerate(groups) if g not in loud}


def _matches(chip: LossChip, loss_filter: LossFilter) -> bool:
    if loss_filter == "all":
        return True
    if loss_filter == "clipped":
        return chip.clipped or chip.dual_clipped
    if loss_filter == "capped":
        return chip.capped
    return chip.clipped or chip.dual_clipped or chip.capped


def _loss_row(
    inspection: Any, tokenizer: Any, i: int, loss_filter: LossFilter = "all", specials: set[int] | None = None
) -> LossRow:
    r = inspection.row(i)
    specials = special_ids(tokenizer) if specials is None else specials
    chips = []
    for pos, tid in enumerate(r["input_ids"]):
        trained = bool(r["loss_mask"][pos])
        text = tokenizer.decode([tid], skip_special_tokens=False)
        turn = int(r["turn_ids"][pos]) if r["turn_ids"] is not None else (0 if trained else -1)
        chip = LossChip(
            position=pos,
            token_id=int(tid),
            visible=text if tid in specials else visible_text(text),
            special=tid in specials,
            trained=trained,
            turn=turn if trained else -1,
            advantage=r["advantages"][pos],
            ratio=r["ratio"][pos],
            clipped=bool(r["clipped"][pos]),
            dual_clipped=bool(r["dual_clipped"][pos]),
            behave_weight=r["behave_weight"][pos],
            capped=bool(r["behave_capped"][pos]),
            entropy=r["entropy"][pos],
            contribution=r["contribution"][pos],
        )
        chip.selected = trained and _matches(chip, loss_filter)
        chips.append(chip)
    turns = []
    for turn in sorted({c.turn for c in chips if c.trained}):
        members = [c for c in chips if c.trained and c.turn == turn]
        turns.append(
            LossTurn(
                turn,
                len(members),
                sum(c.clipped for c in members),
                sum(c.capped for c in members),
                sum(c.contribution for c in members),
                sum(c.advantage for c in members) / len(members),
            )
        )
    return LossRow(i, r["reward"], r["minibatch"], chips, turns, agent=r.get("agent"))


def build_loss_view(
    source: Any,
    tokenizer: Any | None = None,
    rows: list[int] | range | None = None,
    loss_filter: LossFilter = "all",
) -> LossViewModel:
    """Rows of a train step's loss terms; with a filter other than "all", only rows holding
    such tokens (and those tokens marked selected)."""
    if loss_filter not in LOSS_FILTERS:
        raise InvalidArgumentError(f"filter must be one of {LOSS_FILTERS}, got {loss_filter!r}")
    inspection, tokenizer = _resolve_loss_source(source, tokenizer)
    indices = range(inspection.n_rows) if rows is None else rows
    specials = special_ids(tokenizer)
    built = [_loss_row(inspection, tokenizer, i, loss_filter, specials) for i in indices]
    if loss_filter != "all":
        built = [r for r in built if any(c.selected for c in r.chips)]
    agents = list(dict.fromkeys(getattr(inspection, "agents", None) or []))
    silent = _zero_signal_rows(inspection)
    for row in built:
        row.agent_index = agents.index(row.agent) if len(agents) > 1 else None
        row.zero_signal = row.index in silent
    return LossViewModel(
        loss_filter,
        built,
        inspection.n_rows,
        inspection.eps_clip,
        inspection.behave_imp_weight_cap,
        inspection.version,
        agents if len(agents) > 1 else [],
        len(silent),
    )

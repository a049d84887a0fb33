"""Training rows as token chips: text made visible, loss mask, log-prob heat, turns, versions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_nb.api import CREDIT_MODES, CreditMode, ExportStyle, can_export_concat
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

from .sources import collect_interactions, is_complete

VISIBLE_WHITESPACE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}
_DRIFT_CONTEXT = 6  # tokens shown before the first difference of a drift check


@dataclass
class TokenChip:
    position: int
    token_id: int
    text: str  # decoded text
    visible: str  # text with whitespace made visible (what the chip shows)
    special: bool  # a special token of the tokenizer (<|im_end|>, ...)
    loss_mask: int
    logprob: float
    version: int
    turn: int  # turn_ids value: -1 for prompt tokens, 0, 1, ... for generated turns
    heat: str  # CSS colour of the log-prob heat scale ("" for prompt tokens)
    drift: bool = False  # first position where a plain re-render differs
    trained_on: float | None = None  # the return this token trains on (trained tokens only)

    @property
    def title(self) -> str:
        kind = "trained (loss_mask=1)" if self.loss_mask else "not trained (loss_mask=0)"
        parts = [f"#{self.position} id={self.token_id} {self.text!r}", kind]
        if self.loss_mask:
            parts.append(f"logprob={self.logprob:.4f} (p={math.exp(self.logprob):.3f})")
        parts.append(f"turn={self.turn}" if self.turn >= 0 else "prompt / gap")
        if self.trained_on is not None:
            parts.append(f"trains on return {self.trained_on:.4g}")
        parts.append(f"version={self.version}")
        if self.special:
            parts.append("special token")
        if self.drift:
            parts.append("FIRST DIFFERENCE from a plain re-render")
        return " · ".join(parts)


@dataclass
class DriftView:
    """A concat prompt compared with a plain chat-template re-render of the same messages."""

    matches: bool
    first_difference: int | None
    trained: list[str]  # visible token texts around the difference, as trained on
    rendered: list[str]  # the same window of the plain re-render
    window_start: int
    trained_len: int
    rendered_len: int


@dataclass
class TurnBand:
    """One generated turn of a row and the return its tokens train on."""

    turn: int
    interaction_id: str | None  # the call that generated it (None: unknown, a tensor-dict row)
    n_tokens: int  # its trained tokens in this row
    turn_return: float | None  # that call's own (discounted) return
    trained_on: float | None  # what its tokens train on under the row's credit

    @property
    def label(self) -> str:
        return f"turn {self.turn} · trains on {_num(self.trained_on)}"


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


@dataclass
class RowView:
    interaction_id: str | None
    style: ExportStyle  # "concat" (leaf row: the whole conversation) or "individual"
    chips: list[TokenChip]
    n_turns: int
    reward: float | None
    drift: DriftView | None = None
    credit: CreditMode = "leaf"  # "leaf": the row's reward on every turn; "turn": each turn's own return
    bands: list[TurnBand] = field(default_factory=list)  # the row's generated turns, in order
    agent: str | None = None  # the agent that made the row's call (the `model` name it sent)

    @property
    def n_trained(self) -> int:
        return sum(c.loss_mask for c in self.chips)

    @property
    def n_masked(self) -> int:
        return len(self.chips) - self.n_trained


@dataclass
class TokenViewModel:
    style: str
    rows: list[RowView] = field(default_factory=list)
    styles_available: tuple[ExportStyle, ...] = ("individual",)
    credit: CreditMode = "leaf"
    # the episode's agents in order of first appearance; with several, one conversation each
    agents: list[str | None] = field(default_factory=list)

    @property
    def multi_agent(self) -> bool:
        return len(self.agents) > 1


def visible_text(text: str) -> str:
    return "".join(VISIBLE_WHITESPACE.get(ch, ch) for ch in text) or "∅"


def heat_colour(logprob: float) -> str:
    """White (p=1) to red (p→0) by probability, so unlikely sampled tokens stand out."""
    p = min(max(math.exp(logprob), 0.0), 1.0)
    shade = int(round(255 * p))
    return f"rgb(255,{shade},{shade})"


def special_ids(tokenizer: Any) -> set[int]:
    """Named special ids plus added tokens flagged special (`<|im_start|>` is only the latter)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(tid))
    return ids


def build_chips(row: Any, tokenizer: Any) -> list[TokenChip]:
    """Chips from a TokenRow or a tensor dict (batch dim 1 or none)."""
    lists = _row_lists(row)
    specials = special_ids(tokenizer)
    chips = []
    for i, tid in enumerate(lists["input_ids"]):
        text = tokenizer.decode([tid], skip_special_tokens=False)
        mask = int(lists["loss_mask"][i])
        lp = float(lists["logprobs"][i])
        chips.append(
            TokenChip(
                position=i,
                token_id=int(tid),
                text=text,
                visible=text if tid in specials else visible_text(text),
                special=tid in specials,
                loss_mask=mask,
                logprob=lp,
                version=int(lists["versions"][i]),
                turn=int(lists["turn_ids"][i]) if lists["turn_ids"] is not None else (0 if mask else -1),
                heat=heat_colour(lp) if mask else "",
            )
        )
    return chips


def _row_lists(row: Any) -> dict[str, list | None]:
    if hasattr(row, "input_ids") and not isinstance(row, dict):  # TokenRow
        return {
            k: list(getattr(row, k)) for k in ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids")
        }
    if isinstance(row, dict):
        missing = [k for k in ("input_ids", "loss_mask", "logprobs", "versions") if k not in row]
        if missing:
            raise KeyError(f"a token row needs input_ids, loss_mask, logprobs, versions; missing {missing}")
        out: dict[str, list | None] = {}
        length = None
        if "attention_mask" in row:  # padded batch rows: keep the real tokens only
            length = sum(bool(v) for v in _flat(row["attention_mask"])) or None
        for k in ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids"):
            out[k] = _flat(row[k])[:length] if k in row else None
        return out
    raise ArgumentTypeError(f"expected an interaction, a TokenRow or a tensor dict, got {type(row).__name__}")


def _flat(value: Any) -> list:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):
        if len(value) != 1:
            raise InvalidArgumentError(f"expected one row, got a batch of {len(value)}; pass one row")
        value = value[0]
    return list(value)


def tokenizer_of(interaction: Any, tokenizer: Any | None) -> Any:
    if tokenizer is not None:
        return tokenizer
    mr = getattr(interaction, "model_response", None)
    tok = getattr(mr, "tokenizer", None) if mr is not None else None
    if tok is None:
        raise InvalidArgumentError(
            "no tokenizer to decode tokens with: pass tokenizer=... (e.g. session.tokenizer or "
            "areal_nb.models.load_tokenizer('tiny-math'))"
        )
    return tok


def _conversation_path(interaction: Any) -> list[Any]:
    path = []
    node = interaction
    while node is not None:
        path.append(node)
        node = node.parent
    return path[::-1]


def _leaf_of(interaction: Any, pool: list[Any]) -> Any:
    """The deepest completed descendant of `interaction` (first child first)."""
    node = interaction
    while True:
        kids = [x for x in pool if x.parent is node and is_complete(x)]
        if not kids:
            return node
        node = kids[0]


def _drift_view(interaction: Any, tokenizer: Any) -> DriftView | None:
    """The capture layer's retokenization check for this call, windowed for display."""
    try:
        from areal_nb.capture.templates import check_retokenization
    except ImportError:  # capture layer without the drift check: nothing to show
        return None
    if interaction.model_response is None:
        return None
    check = check_retokenization(interaction, tokenizer)
    if check.matches:
        return DriftView(True, None, [], [], 0, len(check.prompt_ids), len(check.rendered_ids))
    start = max(0, check.first_difference - _DRIFT_CONTEXT)
    end = check.first_difference + 3 * _DRIFT_CONTEXT

    def texts(ids: list[int]) -> list[str]:
        return [visible_text(tokenizer.decode([t], skip_special_tokens=False)) for t in ids[start:end]]

    return DriftView(
        False,
        check.first_difference,
        texts(check.prompt_ids),
        texts(check.rendered_ids),
        start,
        len(check.prompt_ids),
        len(check.rendered_ids),
    )


def _row_view(
    interaction: Any,
    tokenizer: Any,
    style: str,
    with_drift: bool = True,
    credit: str = "leaf",
    rewards: Mapping[str, float] | None = None,
) -> RowView:
    """One training row; `rewards` (by interaction id, e.g. a batch's re-discounted values)
    override the calls' own rewards."""
    chips = build_chips(interaction.token_row(), tokenizer)
    drift = (
        _drift_view(interaction, tokenizer)
        if with_drift and interaction.chat_template_type == "concat"
        else None
    )
    if drift is not None and drift.first_difference is not None and drift.first_difference < len(chips):
        chips[drift.first_difference].drift = True
    turns = {c.turn for c in chips if c.turn >= 0}
    reward = _reward_of(interaction, rewards)
    returns = interaction.turn_returns(rewards)
    calls = {c.own_turn_id(): c for c in interaction.row_calls()}
    for chip, own in zip(chips, returns, strict=True):
        if chip.loss_mask:
            chip.trained_on = own if credit == "turn" else (reward or 0.0)
    bands = []
    for turn in sorted(turns):
        members = [(c, r) for c, r in zip(chips, returns, strict=True) if c.turn == turn and c.loss_mask]
        call = calls.get(turn)
        bands.append(
            TurnBand(
                turn,
                call.interaction_id if call is not None else None,
                len(members),
                members[0][1] if members else None,
                members[0][0].trained_on if members else None,
            )
        )
    return RowView(
        interaction.interaction_id,
        style,
        chips,
        len(turns),
        reward,
        drift,
        credit,
        bands,
        getattr(interaction, "agent", None),
    )


def _reward_of(interaction: Any, rewards: Mapping[str, float] | None) -> float | None:
    if rewards is not None and interaction.interaction_id in rewards:
        return float(rewards[interaction.interaction_id])
    return interaction.reward


def _check_credit(credit: str) -> None:
    if credit not in CREDIT_MODES:
        raise InvalidArgumentError(f"credit must be one of {CREDIT_MODES}, got {credit!r}")


def _tensor_row_view(source: Mapping, tokenizer: Any, style: str, credit: str) -> RowView:
    """A tensor-dict row as given: leaf credit from `rewards`, turn credit from `turn_returns`."""
    chips = build_chips(source, tokenizer)
    rewards = source.get("rewards")
    reward = float(_flat(rewards)[0]) if rewards is not None else None
    returns = _flat(source["turn_returns"])[: len(chips)] if "turn_returns" in source else None
    if credit == "turn" and returns is None:
        raise InvalidArgumentError(
            "turn credit needs the row's turn_returns (export it with to_tensor_dict / to_tensors)"
        )
    for i, chip in enumerate(chips):
        if chip.loss_mask:
            chip.trained_on = float(returns[i]) if credit == "turn" else reward
    bands = []
    for turn in sorted({c.turn for c in chips if c.turn >= 0}):
        members = [c for c in chips if c.turn == turn and c.loss_mask]
        own = float(returns[members[0].position]) if members and returns is not None else None
        bands.append(TurnBand(turn, None, len(members), own, members[0].trained_on if members else None))
    return RowView(None, style, chips, len(bands), reward, None, credit, bands)


def build_token_view(
    source: Any,
    style: str | None = None,
    tokenizer: Any | None = None,
    credit: str | None = None,
    index: int | None = None,
    rewards: Mapping[str, float] | None = None,
) -> TokenViewModel:
    """Rows for one conversation, and the return each trained token trains on.

    `concat`: the leaf row that `export_interactions("concat")` trains on (all turns in one
    row). `individual`: one row per call from the root to that leaf, as the individual export
    holds them. A tensor-dict row is shown as it is. A RolloutBatch with `index`: that
    episode, with the batch's discounted rewards and (by default) its credit. `credit`
    ("leaf" | "turn", default "leaf") picks what the per-turn bands and chips report.
    """
    if isinstance(source, dict) and "input_ids" in source:
        if tokenizer is None:
            raise InvalidArgumentError("a tensor-dict row needs tokenizer=... to decode its tokens")
        credit = credit or "leaf"
        _check_credit(credit)
        return TokenViewModel(
            style or "row",
            [_tensor_row_view(source, tokenizer, style or "row", credit)],
            (style or "row",),
            credit,
        )
    if hasattr(source, "episodes") and hasattr(source, "discounted"):  # a RolloutBatch
        i = index or 0
        if not 0 <= i < len(source.episodes):
            raise IndexError(f"episode index {i} out of range: the batch has {len(source.episodes)} episodes")
        rewards = {**source.discounted(i), **(rewards or {})}
        credit = credit or getattr(source, "credit", None)
        tokenizer = tokenizer if tokenizer is not None else getattr(source, "tokenizer", None)
        source = source.episodes[i]
    credit = credit or "leaf"
    _check_credit(credit)
    items = collect_interactions(source)
    complete = [x for x in items if is_complete(x) and x.has_tensor_data]
    if not complete:
        raise InvalidArgumentError("nothing to show: no completed interaction with token data")
    agents = list(dict.fromkeys(getattr(x, "agent", None) for x in complete))
    if hasattr(source, "model_response"):  # one interaction: its own row (children unknown)
        targets, pool = [source], _conversation_path(source)
    else:  # a conversation: the first root, followed down to its leaf; one per agent
        roots = [x for x in complete if x.parent is None] or complete[:1]
        firsts = [next((x for x in roots if getattr(x, "agent", None) == a), None) for a in agents]
        targets = [t for t in firsts if t is not None] if len(agents) > 1 else roots[:1]
        pool = items
    tok = tokenizer_of(targets[0], tokenizer)
    paths = [_conversation_path(_leaf_of(target, pool)) for target in targets]
    available = (
        ("concat", "individual")
        if all(can_export_concat(x.chat_template_type for x in path) for path in paths)
        else ("individual",)
    )
    style = style or available[0]
    if style not in available:
        raise InvalidArgumentError(
            f"style {style!r} is not available for this conversation (available: {available}); "
            "concat rows need chat_template_type='concat'"
        )
    rows = []
    for path in paths:
        leaf = path[-1]
        if style == "concat":
            rows.append(_row_view(leaf, tok, "concat", credit=credit, rewards=rewards))
        else:
            rows.extend(
                _row_view(x, tok, "individual", with_drift=x is leaf, credit=credit, rewards=rewards)
                for x in path
            )
    return TokenViewModel(style, rows, available, credit, agents)

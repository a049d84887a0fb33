"""Live notebook views: conversation trees, token masks, reward propagation, training dashboard.

`show_tree`, `show_tokens`, `show_rewards`, `show_loss` return ipywidgets that follow their source while it
changes; `Dashboard(session)` follows training. The view models (`build_tree`,
`build_token_view`, `reward_state`, `history_series`) are plain data for tests and custom
plots. ipywidgets is imported only when a view is built.
"""

from __future__ import annotations

from typing import Any

from areal_nb.api import CreditMode, CreditNorm, DiscountMode, ExportStyle
from areal_nb.errors import InvalidArgumentError

from .dashboard_model import Series, history_series
from .engine_log import EngineLog
from .loss_model import LOSS_FILTERS, LossFilter, build_loss_view
from .reward_model import RewardSource, discounted_rewards, group_normalised, reward_state
from .token_model import build_token_view
from .tree_model import build_tree


def show_tree(source: Any, tokenizer: Any | None = None, live: bool = True):
    """Conversation tree of an episode, batch, cache, session or callable returning one."""
    from .views import TreeView

    return TreeView(source, tokenizer=tokenizer, live=live)


def show_tokens(
    source: Any,
    tokenizer: Any | None = None,
    style: ExportStyle | None = None,
    live: bool = True,
    credit: CreditMode | None = None,
    index: int | None = None,
):
    """Token chips of an interaction's conversation (or of one tensor-dict row), with the
    return each trained token trains on per turn (`credit` "leaf" | "turn", toggled in the view).

    A RolloutBatch with `index`: that episode with the batch's discount and credit.
    """
    from .views import TokenView

    return TokenView(source, tokenizer=tokenizer, style=style, live=live, credit=credit, index=index)


def show_rewards(
    source: Any,
    index: int | None = None,
    group: list[Any] | None = None,
    discount: float | None = None,
    mode: DiscountMode | None = None,
    style: ExportStyle | None = None,
    raw_rewards: dict[str, float] | None = None,
    live: bool = True,
    credit: CreditMode | None = None,
    credit_norm: CreditNorm = "turn",
):
    """Reward propagation with a live discount slider and the group's per-row advantages; per
    row and turn, the return its tokens train on (`credit` "leaf" | "turn") and its advantage.

    `source` is an episode (with `group=` its group's episodes) or a RolloutBatch with `index`
    (then the group, discount, mode, export style and credit default to the batch's).
    """
    from .views import RewardView

    return RewardView(
        source,
        index=index,
        group=group,
        discount=discount,
        mode=mode,
        style=style,
        raw_rewards=raw_rewards,
        live=live,
        credit=credit,
        credit_norm=credit_norm,
    )


def show_loss(
    source: Any,
    tokenizer: Any | None = None,
    rows: list[int] | range | None = None,
    loss_filter: LossFilter = "all",
    live: bool = True,
):
    """A train step's per-token loss terms on token chips: advantage, ratio (✂ clipped),
    behaviour weight (⊘ capped), entropy and each token's share of the loss, with per-row and
    per-turn sums and a filter for clipped/capped tokens (`loss_filter`, toggled in the view).

    `source`: a session after `session.train_step(batch, inspect=True)` (follows its next
    inspected step), or a `LossInspection` with `tokenizer=`. `rows`: which batch rows (all).
    """
    from .views import LossView

    return LossView(source, tokenizer=tokenizer, rows=rows, loss_filter=loss_filter, live=live)


def view_batch(batch: Any, name: str, i: int):
    """`RolloutBatch.show_<name>(i)`: a batch's `viewer` (the Session gives its batches this one)."""
    if name == "tree":
        return show_tree(batch.episodes[i], tokenizer=batch.tokenizer)
    if name == "tokens":
        return show_tokens(batch.episodes[i], tokenizer=batch.tokenizer)
    if name == "rewards":  # the whole batch, so the view has the episode's group (advantages) and settings
        return show_rewards(batch, index=i)
    raise InvalidArgumentError(f"unknown batch view {name!r}; expected 'tree', 'tokens' or 'rewards'")


def __getattr__(name: str):
    if name in ("Dashboard", "TreeView", "TokenView", "RewardView", "LossView"):
        from . import views

        return getattr(views, name)
    raise AttributeError(f"module 'areal_nb.widgets' has no attribute {name!r}")


__all__ = [
    "LOSS_FILTERS",
    "Dashboard",
    "EngineLog",
    "LossView",
    "RewardSource",
    "RewardView",
    "Series",
    "TokenView",
    "TreeView",
    "build_loss_view",
    "build_token_view",
    "build_tree",
    "discounted_rewards",
    "group_normalised",
    "history_series",
    "reward_state",
    "show_loss",
    "show_rewards",
    "show_tokens",
    "show_tree",
    "view_batch",
]

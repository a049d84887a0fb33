"""The ipywidgets views: composites of standard widgets around generated HTML/SVG.

Each view re-reads its source on `refresh()` and, while live, from a background poller, so a
cell's output follows a running rollout or training without being re-run. Each also carries a
static `text/html` rendering in its display bundle for nbconvert and GitHub previews.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ipywidgets as w

from areal_nb.api import CREDIT_MODES, DISCOUNT_MODES

from . import render
from .dashboard_model import history_length, history_series, signal_warning
from .live import Refresher
from .loss_model import LOSS_FILTERS, LossViewModel, build_loss_view
from .reward_model import RewardSource, RewardViewState, reward_state
from .sources import collect_interactions, is_complete, node_key, resolve_source, snapshot_key
from .token_model import TokenViewModel, build_token_view, tokenizer_of
from .tree_model import build_tree


class LiveView(w.VBox):
    """Base: a poller keyed on the source, `refresh()`, `stop()`, static HTML in the bundle."""

    def _setup_live(self, key, live: bool, interval: float) -> None:
        self._refresher = Refresher(key, self._render, interval)
        self._refresher.refresh(force=True)
        if live:
            self._refresher.start()

    def refresh(self) -> None:
        """Re-read the source and re-render now."""
        self._refresher.refresh(force=True)

    def stop(self) -> None:
        """Stop following the source (the view keeps what it shows)."""
        self._refresher.stop()

    @property
    def live(self) -> bool:
        return self._refresher.running

    def close(self) -> None:
        self.stop()
        super().close()

    def _render(self) -> None:
        raise NotImplementedError

    def to_html(self) -> str:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/html"] = self.to_html()
        return data


class ModelView(LiveView):
    """A live view whose `body` shows one model of its source: `_build()` reads the source into
    the model (the one shown is `self.model`), `_draw(model)` is its HTML."""

    body: w.HTML
    model: Any

    def _build(self) -> Any:
        raise NotImplementedError

    def _draw(self, model: Any) -> str:
        raise NotImplementedError

    def _render(self) -> None:
        self.model = self._build()
        self.body.value = self._draw(self.model)

    def to_html(self) -> str:
        return self._draw(self._build())


def _credit_toggle(value: str) -> w.ToggleButtons:
    """The toggle between the two credit modes, the views' same words for each."""
    return w.ToggleButtons(
        options=list(CREDIT_MODES),
        value=value,
        description="credit",
        tooltips=[
            "every turn trains on the row's (leaf's) reward",
            "each turn trains on its own discounted return",
        ],
    )


class TreeView(LiveView):
    def __init__(
        self, source: Any, tokenizer: Any | None = None, live: bool = True, interval: float = 0.4
    ) -> None:
        self.source, self.tokenizer = source, tokenizer
        self.tree_html = w.HTML()
        self.node_select = w.Dropdown(description="node", options=[], layout=w.Layout(width="420px"))
        self.detail = w.HTML()
        super().__init__([self.tree_html, self.node_select, self.detail])
        self.add_class("anb-tree-view")
        self.node_select.observe(lambda _: self._render_detail(), names="value")
        self._setup_live(lambda: snapshot_key(self.source), live, interval)

    def _render(self) -> None:
        self.model = build_tree(self.source)
        selected = self.node_select.value
        self.tree_html.value = render.tree_svg(self.model, selected) + render.TREE_LEGEND
        options = [(f"{n.id} · {n.label}{' · pending' if n.pending else ''}", n.id) for n in self.model.nodes]
        if [o[1] for o in self.node_select.options] != [o[1] for o in options] or list(
            self.node_select.options
        ) != options:
            self.node_select.options = options
            if selected in [o[1] for o in options]:
                self.node_select.value = selected
        self._render_detail()

    def _render_detail(self) -> None:
        node_id = self.node_select.value
        items = collect_interactions(self.source)
        match = [x for i, x in enumerate(items) if node_key(x, i) == node_id]
        if not match:
            self.detail.value = "<i>select a node to see its messages and tokens</i>"
            return
        x = match[0]
        self.tree_html.value = render.tree_svg(self.model, node_id) + render.TREE_LEGEND
        tokens = ""
        if is_complete(x) and x.has_tensor_data:
            try:
                tokens = render.token_view_html(
                    build_token_view(x, "individual", tokenizer_of(x, self.tokenizer))
                )
            except (ValueError, KeyError) as e:
                tokens = f"<i>no token view: {render.esc(e)}</i>"
        self.detail.value = (
            f'<div class="anb-detail" data-node-id="{render.esc(node_id)}">'
            + render.messages_html(x)
            + tokens
            + "</div>"
        )

    def to_html(self) -> str:
        return render.tree_svg(build_tree(self.source)) + render.TREE_LEGEND


class TokenView(ModelView):
    def __init__(
        self,
        source: Any,
        tokenizer: Any | None = None,
        style: str | None = None,
        live: bool = True,
        interval: float = 0.4,
        credit: str | None = None,
        index: int | None = None,
    ) -> None:
        self.source, self.tokenizer, self.index = source, tokenizer, index
        first = build_token_view(resolve_source(source), style, tokenizer, credit, index)
        self.style_toggle = w.ToggleButtons(
            options=list(first.styles_available),
            value=first.style,
            description="rows",
            tooltips=[
                {
                    "concat": "the leaf row: all turns in one row",
                    "individual": "one row per call",
                    "row": "the row as given",
                }[s]
                for s in first.styles_available
            ],
        )
        self.credit_toggle = _credit_toggle(first.credit)
        self.body = w.HTML()
        super().__init__([w.HBox([self.style_toggle, self.credit_toggle]), self.body])
        self.add_class("anb-token-view")
        for control in (self.style_toggle, self.credit_toggle):
            control.observe(lambda _: self.refresh(), names="value")
        is_row = isinstance(source, Mapping) and "input_ids" in source
        self._setup_live(
            (lambda: None) if is_row else (lambda: snapshot_key(self.source)), live and not is_row, interval
        )

    def _build(self) -> TokenViewModel:
        return build_token_view(
            resolve_source(self.source),
            self.style_toggle.value,
            self.tokenizer,
            self.credit_toggle.value,
            self.index,
        )

    def _draw(self, model: TokenViewModel) -> str:
        return render.token_view_html(model)


class RewardView(ModelView):
    def __init__(
        self,
        source: Any,
        index: int | None = None,
        group: list[Any] | None = None,
        discount: float | None = None,
        mode: str | None = None,
        style: str | None = None,
        raw_rewards: Mapping[str, float] | None = None,
        live: bool = True,
        interval: float = 0.4,
        credit: str | None = None,
        credit_norm: str = "turn",
    ) -> None:
        self.source, self.index, self.group, self.raw_rewards = source, index, group, raw_rewards
        self.credit_norm = credit_norm
        src = self._reward_source()
        defaults = src.defaults or {}
        if discount is None:
            discount = defaults["discount"] if defaults.get("discount") is not None else 1.0
        mode = mode or defaults.get("mode") or "tree"
        style = style or defaults.get("style")
        credit = credit or defaults.get("credit") or "leaf"
        self.slider = w.FloatSlider(
            value=discount,
            min=0.0,
            max=1.0,
            step=0.05,
            description="discount γ",
            continuous_update=True,
            readout_format=".2f",
        )
        self.mode_toggle = w.ToggleButtons(
            options=list(DISCOUNT_MODES),
            value=mode,
            description="mode",
            tooltips=["per branch: own + γ·mean(children)", "reverse call order: r[i] += γ·r[i+1] (AReaL)"],
        )
        state = reward_state(src, discount, mode, style, credit, credit_norm)
        styles = ["concat", "individual"] if state.style == "concat" else ["individual"]
        self.style_toggle = w.ToggleButtons(options=styles, value=state.style, description="export")
        self.credit_toggle = _credit_toggle(credit)
        self.body = w.HTML()
        super().__init__(
            [
                w.HBox([self.slider, self.mode_toggle]),
                w.HBox([self.style_toggle, self.credit_toggle]),
                self.body,
            ]
        )
        self.add_class("anb-reward-view")
        for control in (self.slider, self.mode_toggle, self.style_toggle, self.credit_toggle):
            control.observe(lambda _: self.refresh(), names="value")
        self._setup_live(lambda: snapshot_key(self.group or self.source), live, interval)

    def _reward_source(self) -> RewardSource:
        return RewardSource.from_any(resolve_source(self.source), self.index, self.group, self.raw_rewards)

    @property
    def state(self) -> RewardViewState:
        """The reward state shown (the view's model)."""
        return self.model

    def _build(self) -> RewardViewState:
        return reward_state(
            self._reward_source(),
            self.slider.value,
            self.mode_toggle.value,
            self.style_toggle.value,
            self.credit_toggle.value,
            self.credit_norm,
        )

    def _draw(self, model: RewardViewState) -> str:
        return render.reward_html(model)


class Dashboard(LiveView):
    """Live training curves from `session.history`, plus the latest batch's table."""

    def __init__(self, session: Any, live: bool = True, interval: float = 0.5) -> None:
        self.session = session
        self.body = w.HTML()
        super().__init__([self.body])
        self.add_class("anb-dashboard-view")
        self._setup_live(self._key, live, interval)
        add_callback = getattr(session, "add_step_callback", None)
        if callable(add_callback):  # immediate update after each step, on top of polling
            add_callback(self._on_step)

    def _on_step(self, *args: Any, **kwargs: Any) -> None:
        self._refresher.refresh()

    def _key(self) -> tuple:
        batch = getattr(self.session, "last_batch", None)
        return history_length(getattr(self.session, "history", None)), id(batch)

    def _render(self) -> None:
        self.body.value = self.to_html()

    def to_html(self) -> str:
        history = getattr(self.session, "history", None)
        batch = getattr(self.session, "last_batch", None)
        table = render.batch_table_html(batch) if batch is not None else ""
        return render.dashboard_html(
            history_series(history), history_length(history), table, warning=signal_warning(history)
        )


class LossView(ModelView):
    """A train step's per-token loss terms on token chips, with a clipped/capped filter.

    Follows `session.last_inspection` when given a session: the next inspected step shows up.
    """

    def __init__(
        self,
        source: Any,
        tokenizer: Any | None = None,
        rows: list[int] | range | None = None,
        loss_filter: str = "all",
        live: bool = True,
        interval: float = 0.4,
    ) -> None:
        self.source, self.tokenizer, self.rows = source, tokenizer, rows
        build_loss_view(source, tokenizer, rows, loss_filter)  # bad input fails here, not in a poller
        self.filter_toggle = w.ToggleButtons(
            options=list(LOSS_FILTERS),
            value=loss_filter,
            description="show",
            tooltips=[
                "every row",
                "rows with clipped ratios",
                "rows with capped behaviour weights",
                "either",
            ],
        )
        self.body = w.HTML()
        super().__init__([self.filter_toggle, self.body])
        self.add_class("anb-loss-view")
        self.filter_toggle.observe(lambda _: self.refresh(), names="value")
        follows = not hasattr(source, "contribution")  # a session/actor: its next inspected step
        self._setup_live(
            lambda: id(getattr(self.source, "last_inspection", self.source)), live and follows, interval
        )

    def _build(self) -> LossViewModel:
        return build_loss_view(self.source, self.tokenizer, self.rows, self.filter_toggle.value)

    def _draw(self, model: LossViewModel) -> str:
        return render.loss_view_html(model)

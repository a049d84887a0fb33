"""`CompareView`: the lab's token lanes (`compare_model.py`) with a row picker and a variant picker."""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from .compare_model import build_compare_model, compare_html, trained_rows


class CompareView(w.VBox):
    """One row of a `session.compare(...)` result: token chips, a lane per picked variant,
    the tokens where the picked variants disagree highlighted."""

    def __init__(self, comparison: Any, row: int | None = None) -> None:
        self.comparison = comparison
        rows = trained_rows(comparison)
        self.model = build_compare_model(comparison, row)  # bad input fails here
        names = list(comparison.variants)
        self.row_picker = w.Dropdown(options=rows, value=self.model.row, description="row")
        self.variant_picker = w.SelectMultiple(
            options=names, value=tuple(names), description="variants", rows=min(len(names), 7)
        )
        self.body = w.HTML()
        super().__init__([w.HBox([self.row_picker, self.variant_picker]), self.body])
        self.add_class("anb-compare-view")
        self.row_picker.observe(lambda _: self._render(), names="value")
        self.variant_picker.observe(lambda _: self._render(), names="value")
        self._render()

    def _render(self) -> None:
        picked = list(self.variant_picker.value) or list(self.comparison.variants)[:1]
        self.model = build_compare_model(self.comparison, self.row_picker.value, picked)
        self.body.value = compare_html(self.model)

    def to_html(self) -> str:
        return compare_html(self.model)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/html"] = self.to_html()
        return bundle

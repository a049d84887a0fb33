"""The lab's token lanes: one batch row's tokens as chips, one lane per algorithm variant.

Each lane cell is the variant's push on the token, −∂loss/∂log π_θ(y_t) (green: up, red: down,
darker: stronger, on one scale for all lanes), outlined when the variant's clip bounded the
token and crossed out when it dropped it (behaviour-weight cap, MIS). A token where the shown
variants disagree — the push's sign, or a clip or drop decision — is highlighted.
Reads a `session.lab.Comparison` (duck-typed: `variants`, `input_ids`, `loss_mask`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from areal_nb.errors import InvalidArgumentError

from .token_model import VISIBLE_WHITESPACE

_ZERO = 1e-9  # |push| below this share of the row's largest counts as none


@dataclass
class LaneCell:
    weight: float
    clipped: bool
    masked: bool
    color: str
    title: str


@dataclass
class CompareRowModel:
    row: int
    n_rows: int
    reward: float
    positions: list[int]  # the row's positions shown (its generated span)
    tokens: list[str]  # visible token texts
    trained: list[bool]
    names: list[str]  # the lanes, in order
    lanes: dict[str, list[LaneCell]]
    disagree: list[bool]

    @property
    def n_disagree(self) -> int:
        return sum(self.disagree)


def trained_rows(comparison: Any) -> list[int]:
    return [i for i in range(comparison.loss_mask.shape[0]) if bool(comparison.loss_mask[i].any())]


def build_compare_model(
    comparison: Any, row: int | None = None, names: list[str] | None = None
) -> CompareRowModel:
    """Row `row` (default: the first with trained tokens) under the variants `names` (default all)."""
    rows = trained_rows(comparison)
    if not rows:
        raise InvalidArgumentError("the compared batch has no trained tokens")
    row = rows[0] if row is None else row
    n_rows = comparison.loss_mask.shape[0]
    if not 0 <= row < n_rows:
        raise IndexError(f"row {row} out of range: the batch has {n_rows} rows")
    names = list(comparison.variants) if names is None else list(names)
    unknown = [n for n in names if n not in comparison.variants]
    if unknown:
        raise InvalidArgumentError(f"unknown variant(s) {unknown}; compared: {list(comparison.variants)}")
    mask = comparison.loss_mask[row]
    on = mask.nonzero().flatten().tolist()
    positions = list(range(on[0], on[-1] + 1)) if on else []
    ids = comparison.input_ids[row].tolist()
    tokens = [_visible(_decode(comparison.tokenizer, ids[p])) for p in positions]
    trained = [bool(mask[p]) for p in positions]
    results = [comparison.variants[n] for n in names]
    scale = max([abs(float(r.token_weight[row, p])) for r in results for p in positions] + [0.0])
    lanes: dict[str, list[LaneCell]] = {}
    for r in results:
        cells = []
        for p, t in zip(positions, trained, strict=True):
            w = float(r.token_weight[row, p])
            clipped, masked = bool(r.clipped[row, p]), bool(r.masked[row, p])
            title = (
                f"{r.name} · #{p} · push {w:+.4g} · advantage {float(r.advantages[row, p]):+.4g}"
                + (" · clipped" if clipped else "")
                + (" · dropped" if masked else "")
                + (f" · mismatch weight {float(r.mismatch_weight[row, p]):.4g}" if t else "")
            )
            cells.append(
                LaneCell(w, clipped, masked, _color(w, scale) if t else "", title if t else "not trained")
            )
        lanes[r.name] = cells
    disagree = []
    for k, t in enumerate(trained):
        if not t or len(names) < 2:
            disagree.append(False)
            continue
        cells = [lanes[n][k] for n in names]
        signs = {_sign(c.weight, scale) for c in cells}
        disagree.append(
            len(signs) > 1 or len({c.clipped for c in cells}) > 1 or len({c.masked for c in cells}) > 1
        )
    return CompareRowModel(
        row, n_rows, float(comparison.rewards[row]), positions, tokens, trained, names, lanes, disagree
    )


def compare_html(model: CompareRowModel) -> str:
    """The row as an HTML table: a token chip per column, a lane per variant."""
    head = (
        f'<div class="anb-compare-head" style="font-size:11px;margin:4px 0">row {model.row} of '
        f"{model.n_rows} · reward {model.reward:.4g} · {sum(model.trained)} trained tokens · "
        f"<b>{model.n_disagree}</b> where the variants disagree (highlighted)</div>"
    )
    cells = ['<th style="text-align:right;font-weight:normal;padding-right:4px">token</th>']
    for k, text in enumerate(model.tokens):
        style = (
            "background:#ffe066;outline:2px solid #e0a800"
            if model.disagree[k]
            else ("background:#f4f4f4" if not model.trained[k] else "background:#fff")
        )
        cls = "anb-compare-token" + (" anb-disagree" if model.disagree[k] else "")
        cells.append(
            f'<td class="{cls}" data-pos="{model.positions[k]}" style="{style};border:1px solid #ccc;'
            f'padding:0 2px;white-space:pre;font-family:monospace">{escape(text)}</td>'
        )
    lines = ["<tr>" + "".join(cells) + "</tr>"]
    for name in model.names:
        row = [f'<th style="text-align:right;font-weight:normal;padding-right:4px">{escape(name)}</th>']
        for k, cell in enumerate(model.lanes[name]):
            style = f"background:{cell.color or '#fafafa'};height:14px;min-width:10px"
            if cell.clipped:
                style += ";outline:2px dashed #333;outline-offset:-2px"
            mark = "×" if cell.masked else ""
            row.append(
                f'<td class="anb-lane" data-variant="{escape(name)}" data-pos="{model.positions[k]}" '
                f'data-clipped="{int(cell.clipped)}" data-masked="{int(cell.masked)}" '
                f'title="{escape(cell.title)}" style="{style};text-align:center;font-size:10px">{mark}</td>'
            )
        lines.append("<tr>" + "".join(row) + "</tr>")
    legend = (
        '<div style="font-size:10px;color:#555">lane colour: the push on the token, −∂loss/∂log π '
        "(green up, red down) · dashed outline: clipped · ×: dropped (behaviour-weight cap, MIS)</div>"
    )
    return (
        f'<div class="anb-compare">{head}<div style="overflow-x:auto"><table style="border-collapse:collapse;'
        f'font-size:12px">{"".join(lines)}</table></div>{legend}</div>'
    )


def _decode(tokenizer: Any, token_id: int) -> str:
    if tokenizer is None:
        return f"<{token_id}>"
    return tokenizer.decode([token_id])


def _visible(text: str) -> str:
    return "".join(VISIBLE_WHITESPACE.get(ch, ch) for ch in text) or "∅"


def _sign(weight: float, scale: float) -> int:
    if abs(weight) <= _ZERO * max(scale, 1e-30):
        return 0
    return 1 if weight > 0 else -1


def _color(weight: float, scale: float) -> str:
    if scale <= 0 or _sign(weight, scale) == 0:
        return "#ffffff"
    strength = min(abs(weight) / scale, 1.0)
    fade = int(255 - 175 * strength)
    return f"rgb({fade},255,{fade})" if weight > 0 else f"rgb(255,{fade},{fade})"

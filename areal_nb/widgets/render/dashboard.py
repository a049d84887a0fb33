"""The training dashboard: one sparkline per metric, a banner when most groups had nothing to
learn from, and the latest batch as a table.
"""

from __future__ import annotations

from typing import Any

from ..dashboard_model import Series
from .markup import esc, fmt


def _sparkline_svg(s: Series, width: int = 230, height: int = 96) -> str:
    pts = s.points
    label = f"{s.label}: {fmt(s.last)}" if pts else f"{s.label}: no data"
    head = (
        f'<svg class="anb-plot" data-metric="{esc(s.column)}" data-points="{len(pts)}" width="{width}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg" style="font-size:11px;font-family:sans-serif">'
        f'<rect width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>'
        f'<text x="6" y="14">{esc(label)}</text>'
    )
    if not pts:
        return head + "</svg>"
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        y0, y1 = y0 - 1, y1 + 1

    def px(x: float) -> float:
        return 10 + (width - 20) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def py(y: float) -> float:
        return height - 10 - (height - 32) * (y - y0) / (y1 - y0)

    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
    dots = "".join(
        f'<circle class="anb-pt" cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="#1f77b4">'
        f"<title>step {x}: {y:.4g}</title></circle>"
        for x, y in pts
    )
    axis = f'<text x="{width - 6}" y="14" text-anchor="end" fill="#666">{fmt(y0)}…{fmt(y1)}</text>'
    return (
        head
        + axis
        + f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        + dots
        + "</svg>"
    )


def dashboard_html(series: list[Series], n_steps: int, table: str = "", warning: str | None = None) -> str:
    """The curves; `warning` (most groups of the latest step without signal, and what to try) above them."""
    plots = "".join(f'<div style="display:inline-block;margin:2px">{_sparkline_svg(s)}</div>' for s in series)
    banner = (
        '<div class="anb-signal-warning" role="alert" style="font-size:12px;margin:4px 0;padding:4px 6px;'
        f'border:2px solid #e67e00;background:#fff4e0">⚠ <b>little to learn from</b>: {esc(warning)}</div>'
        if warning
        else ""
    )
    return (
        f'<div class="anb-dashboard" data-steps="{n_steps}"><div style="font-size:12px"><b>training</b>: '
        f"{n_steps} step(s) · each dot is one step (hover for the value)</div>{banner}{plots}"
        + (f'<div class="anb-batch" style="font-size:11px"><b>latest batch</b>{table}</div>' if table else "")
        + "</div>"
    )


def batch_table_html(batch: Any, max_rows: int = 12) -> str:
    df = getattr(batch, "interactions_df", None)
    if df is not None and hasattr(df, "to_html"):
        return df.head(max_rows).to_html(
            classes="anb-batch-table", border=0, float_format=lambda v: f"{v:.4g}"
        )
    rows = []
    for e in getattr(batch, "episodes", []) or []:
        n = len(e.interactions or {})
        status = "accepted" if e.accepted else f"rejected: {e.rejection_reason}"
        rows.append(f"<tr><td>{e.group_id}</td><td>{e.sample_id}</td><td>{n}</td><td>{esc(status)}</td></tr>")
    if not rows:
        return ""
    return (
        '<table class="anb-batch-table"><tr><th>group</th><th>sample</th><th>calls</th><th>status</th></tr>'
        + "".join(rows[:max_rows])
        + "</table>"
    )

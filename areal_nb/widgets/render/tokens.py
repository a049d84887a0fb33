"""The token view: each training row's tokens as chips (trained or not, log-prob heat), grouped in
turn bands that name the return each turn trains on, and the retokenization drift check.
"""

from __future__ import annotations

from typing import Any

from ..token_model import RowView, TokenViewModel
from .markup import FONT, agent_colour, agents_legend_html, esc, fmt

_TOKEN_LEGEND = (
    '<div class="anb-legend" style="font-size:11px;margin:4px 0"><b>Legend:</b> '
    '<span style="border:1.5px solid #222;padding:0 3px">solid chip</span> = trained (loss_mask=1), '
    "background = log-prob heat (white p=1 → red p≈0) · "
    '<span style="border:1px dashed #999;color:#777;padding:0 3px">dashed grey chip</span> = not trained '
    "(loss_mask=0: prompt, tool results, gaps) · <b>bold</b> = special token · · = space, ↵ = newline, → = tab · "
    '"turn N · trains on R" bands group each generated turn and name the return its tokens train on '
    "(credit leaf: the row's reward on every turn; credit turn: the turn's own discounted return) · "
    '<span style="outline:2px solid #c00">red outline ⚠</span> = '
    "first position where a plain re-render differs · hover a chip for id, log-prob, turn, version, return</div>"
)


def _chip_html(c: Any) -> str:
    if c.loss_mask:
        style = f"border:1.5px solid #222;background:{c.heat};color:#000"
    else:
        style = "border:1px dashed #999;background:#f4f4f4;color:#777"
    if c.special:
        style += ";font-weight:bold"
    if c.drift:
        style += ";outline:2px solid #c00"
    cls = "anb-chip " + ("anb-loss" if c.loss_mask else "anb-noloss") + (" anb-special" if c.special else "")
    cls += " anb-drift" if c.drift else ""
    mark = "⚠" if c.drift else ""
    return (
        f'<span class="{cls}" data-pos="{c.position}" data-mask="{c.loss_mask}" data-turn="{c.turn}" '
        f'title="{esc(c.title)}" style="{style};display:inline-block;margin:1px;padding:0 2px;'
        f'border-radius:3px;white-space:pre">{mark}{esc(c.visible)}</span>'
    )


def _row_html(row: RowView, agent_index: int | None = None) -> str:
    """One row; `agent_index` (several agents: the row's agent's place) names and colours its agent."""
    who = ""
    if agent_index is not None:
        who = (
            f'<span class="anb-row-agent" data-agent="{esc(row.agent)}" style="border-left:8px solid '
            f'{agent_colour(agent_index)};padding:0 4px">agent <b>{esc(row.agent)}</b></span> · '
        )
    head = (
        f'<div class="anb-row-head" style="font-size:11px;margin-top:6px">{who}<b>{esc(row.style)} row</b> '
        f"{esc(row.interaction_id or '')} · {len(row.chips)} tokens · {row.n_trained} trained / "
        f"{row.n_masked} not trained · {row.n_turns} turn(s) · reward {fmt(row.reward)} · "
        f"credit <b>{esc(row.credit)}</b></div>"
    )
    by_turn = {b.turn: b for b in row.bands}
    bands, current, run = [], None, []
    for c in row.chips + [None]:
        turn = None if c is None else c.turn
        if run and (c is None or turn != current):
            band = by_turn.get(current)
            label = "prompt / gap" if current < 0 else (band.label if band is not None else f"turn {current}")
            title = (
                label
                if band is None
                else (
                    f"{label} ({row.credit} credit; this turn's own return {fmt(band.turn_return)}, "
                    f"call {band.interaction_id or '?'})"
                )
            )
            value = f' data-trained-on="{fmt(band.trained_on)}"' if band is not None else ""
            border = "#bbb" if current < 0 else ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"][current % 4]
            bands.append(
                f'<span class="anb-band" data-turn="{current}"{value} title="{esc(title)}" '
                f'style="border-bottom:3px solid {border};margin-right:2px">'
                f'<sup style="font-size:9px;color:#333">{esc(label)}</sup>'
                + "".join(_chip_html(x) for x in run)
                + "</span>"
            )
            run = []
        if c is not None:
            current = turn
            run.append(c)
    agent_attr = f' data-agent="{esc(row.agent)}"' if agent_index is not None else ""
    body = f'<div class="anb-row" data-style="{esc(row.style)}"{agent_attr} style="{FONT};font-size:12px;line-height:2">{"".join(bands)}</div>'
    return head + body + _turn_table_html(row) + _drift_html(row)


def _turn_table_html(row: RowView) -> str:
    """The row's turns and the return each trains on, as text (readable without colours)."""
    if not row.bands:
        return ""
    cells = "".join(
        f'<tr class="anb-turn" data-turn="{b.turn}"><td>turn {b.turn}</td><td>{esc(b.interaction_id or "–")}</td>'
        f'<td>{b.n_tokens}</td><td>{fmt(b.turn_return)}</td><td class="anb-trained-on">{fmt(b.trained_on)}</td></tr>'
        for b in row.bands
    )
    return (
        f'<table class="anb-turns" data-credit="{esc(row.credit)}" style="font-size:11px;border-collapse:collapse">'
        "<tr><th>turn</th><th>call</th><th>trained tokens</th><th>turn's own return</th>"
        f"<th>trains on ({esc(row.credit)} credit)</th></tr>{cells}</table>"
    )


def _drift_html(row: RowView) -> str:
    d = row.drift
    if d is None:
        return ""
    if d.matches:
        return (
            '<div class="anb-drift-check" data-drift="none" style="font-size:11px">drift check: the prompt '
            "equals a plain re-render of its messages ✓</div>"
        )

    def seq(texts: list[str], label: str) -> str:
        cells = "".join(
            f'<span style="border:1px solid #999;margin:1px;padding:0 2px;'
            f'{"outline:2px solid #c00;" if d.window_start + i == d.first_difference else ""}">{esc(t)}</span>'
            for i, t in enumerate(texts)
        )
        return f"<div><b>{label}</b> (from token {d.window_start}): {cells}</div>"

    return (
        f'<div class="anb-drift-check" data-drift="{d.first_difference}" style="font-size:11px;{FONT}">'
        f"⚠ drift: a plain re-render differs from the trained tokens first at position {d.first_difference} "
        f"(trained {d.trained_len} prompt tokens, re-render {d.rendered_len})"
        + seq(d.trained, "trained on")
        + seq(d.rendered, "re-render")
        + "</div>"
    )


def token_view_html(model: TokenViewModel) -> str:
    return (
        f'<div class="anb-tokens" data-style="{esc(model.style)}" data-credit="{esc(model.credit)}">'
        + _TOKEN_LEGEND
        + agents_legend_html(model.agents)
        + "".join(
            _row_html(
                r, model.agents.index(r.agent) if model.multi_agent and r.agent in model.agents else None
            )
            for r in model.rows
        )
        + "</div>"
    )

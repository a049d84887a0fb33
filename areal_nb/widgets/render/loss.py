"""The loss view: each trained token's share of the loss, its advantage's sign, and whether its
ratio was clipped or its behaviour weight capped, per row and per turn.
"""

from __future__ import annotations

from typing import Any

from ..loss_model import ZERO_ADVANTAGE
from .markup import FONT, agent_colour, agents_legend_html, esc, fmt

_LOSS_LEGEND = (
    '<div class="anb-legend" style="font-size:11px;margin:4px 0"><b>Legend:</b> '
    "one chip per token, as in the token view · background = advantage sign "
    '(<span style="background:rgb(200,240,200);padding:0 3px">green</span> A&gt;0: pushed up, '
    '<span style="background:rgb(250,205,205);padding:0 3px">red</span> A&lt;0: pushed down), stronger = '
    'larger share of the loss · <span style="outline:2px dashed #e67e00;padding:0 3px">✂ dashed orange</span> = '
    "ratio clipped (no gradient through it) · "
    '<span style="text-decoration:line-through;padding:0 3px">⊘ struck through</span> = behaviour weight above '
    "the cap: masked out of the loss · dashed grey = not trained · faded = not matching the filter · "
    '<span style="background:#e4e4e4;padding:0 3px">grey</span> A=0: no push; a row marked '
    "<b>no signal</b> is in a group whose rewards were all equal (every advantage 0) · "
    "hover a chip for advantage, ratio, behaviour weight, entropy and loss contribution</div>"
)


def _loss_background(c: Any, scale: float) -> str:
    if abs(c.advantage) <= ZERO_ADVANTAGE:
        return "#e4e4e4"  # no push either way
    strength = min(abs(c.contribution) / scale, 1.0) if scale > 0 else 0.0
    fade = int(round(255 - 70 * (0.3 + 0.7 * strength)))
    return f"rgb({fade},240,{fade})" if c.advantage >= 0 else f"rgb(250,{fade},{fade})"


def _loss_chip_html(c: Any, scale: float) -> str:
    if c.trained:
        style = f"border:1.5px solid #222;background:{_loss_background(c, scale)};color:#000"
    else:
        style = "border:1px dashed #999;background:#f4f4f4;color:#777"
    cls = "anb-chip " + ("anb-loss" if c.trained else "anb-noloss")
    mark = ""
    if c.clipped or c.dual_clipped:
        style += ";outline:2px dashed #e67e00"
        cls += " anb-clipped"
        mark += "✂"
    if c.capped:
        style += ";text-decoration:line-through"
        cls += " anb-capped"
        mark += "⊘"
    if c.trained and not c.selected:
        style += ";opacity:0.3"
        cls += " anb-dim"
    if c.special:
        style += ";font-weight:bold"
    return (
        f'<span class="{cls}" data-pos="{c.position}" data-turn="{c.turn}" data-clipped="{int(c.clipped)}" '
        f'data-capped="{int(c.capped)}" data-contribution="{c.contribution:.6g}" title="{esc(c.title)}" '
        f'style="{style};display:inline-block;margin:1px;padding:0 2px;border-radius:3px;white-space:pre">'
        f"{mark}{esc(c.visible)}</span>"
    )


def _loss_row_html(row: Any, scale: float) -> str:
    agent_index = getattr(row, "agent_index", None)
    who, agent_attr, bar = "", "", ""
    if agent_index is not None:  # several agents: the row's agent by name and colour
        who = f' · agent <b class="anb-row-agent">{esc(row.agent if row.agent is not None else "(no model name)")}</b>'
        agent_attr = f' data-agent="{esc(row.agent)}"'
        bar = f";border-left:8px solid {agent_colour(agent_index)};padding-left:4px"
    head = (
        f'<div class="anb-row-head"{agent_attr} style="font-size:11px;margin-top:6px{bar}"><b>row {row.index}</b>{who} · reward '
        f"{fmt(row.reward)} · minibatch {row.minibatch} · Σ loss contribution "
        f'<b class="anb-row-sum">{row.contribution:.4g}</b> · {row.n_clipped} clipped · {row.n_capped} capped'
        + (
            ' · <b class="anb-zero-signal" style="color:#9a5a00" title="every row of its group had the same '
            'reward, so every advantage is 0: this row does not move the policy">no signal: '
            "its group's rewards were all equal</b>"
            if getattr(row, "zero_signal", False)
            else ""
        )
        + "</div>"
    )
    chips = "".join(_loss_chip_html(c, scale) for c in row.chips)
    body = (
        f'<div class="anb-row anb-loss-row" data-row="{row.index}"{agent_attr} style="{FONT};font-size:12px;line-height:2">'
        f"{chips}</div>"
    )
    cells = "".join(
        f'<tr class="anb-turn" data-turn="{t.turn}"><td>turn {t.turn}</td><td>{t.n_tokens}</td>'
        f"<td>{fmt(t.advantage_mean)}</td><td>{t.n_clipped}</td><td>{t.n_capped}</td>"
        f'<td class="anb-turn-sum">{t.contribution:.4g}</td></tr>'
        for t in row.turns
    )
    table = (
        '<table class="anb-turns" style="font-size:11px;border-collapse:collapse"><tr><th>turn</th>'
        "<th>trained tokens</th><th>mean advantage</th><th>clipped</th><th>capped</th><th>Σ loss contribution</th></tr>"
        f"{cells}</table>"
        if row.turns
        else ""
    )
    return head + body + table


def loss_view_html(model: Any) -> str:
    trained = [abs(c.contribution) for r in model.rows for c in r.chips if c.trained]
    scale = max(trained, default=0.0)
    cap = "none" if model.behave_imp_weight_cap is None else fmt(model.behave_imp_weight_cap)
    summary = (
        f'<div class="anb-loss-summary" style="font-size:11px">update of policy version {model.version} · '
        f"eps_clip {fmt(model.eps_clip)} · behaviour-weight cap {cap} · filter <b>{esc(model.filter)}</b>: "
        f"{len(model.rows)} of {model.n_rows_total} rows · Σ shown contributions {model.loss:.4g}"
        + (
            f' · <b class="anb-zero-signal-count" style="color:#9a5a00">{model.n_zero_signal} of '
            f"{model.n_rows_total} rows in groups without signal</b>"
            if getattr(model, "n_zero_signal", 0)
            else ""
        )
        + "</div>"
    )
    rows = "".join(_loss_row_html(r, scale) for r in model.rows) or "<i>no row has such tokens</i>"
    return (
        f'<div class="anb-loss" data-filter="{esc(model.filter)}">'
        + summary
        + _LOSS_LEGEND
        + agents_legend_html(getattr(model, "agents", []))
        + rows
        + "</div>"
    )

"""HTML/SVG for every view: used inside the widgets and as the static fallback (nbconvert, GitHub).

Inline styles only (no <style> blocks) so the markup survives sanitisers. Nothing relies on colour
alone: shapes differ (dashed = pending / not trained), text labels say it, and every element has
a hover title.
"""

from __future__ import annotations

import html
from typing import Any

from .dashboard_model import Series
from .loss_model import ZERO_ADVANTAGE
from .reward_model import RewardViewState
from .token_model import RowView, TokenViewModel
from .tree_model import TreeModel, TreeNode

NODE_W, NODE_H, COL_W, ROW_H, PAD = 176, 74, 192, 104, 12
_FONT = "font-family:ui-monospace,Menlo,Consolas,monospace"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def fmt(v: float | None, digits: int = 4) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


# ----------------------------------------------------------------------------------- agents
# One colour per agent of a multi-agent episode (the agent's place in order of first appearance);
# every coloured mark also names its agent in text.
_AGENT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def agent_colour(index: int) -> str:
    return _AGENT_COLOURS[index % len(_AGENT_COLOURS)]


def _agents_legend_html(agents: list[str | None]) -> str:
    """The agents and their colours; empty for a single agent (nothing to tell apart)."""
    if len(agents) <= 1:
        return ""
    items = "".join(
        f'<span class="anb-agent" data-agent="{esc(agent)}" style="border-left:8px solid {agent_colour(i)};'
        f'padding:0 6px;margin-right:8px">{esc(agent if agent is not None else "(no model name)")}</span>'
        for i, agent in enumerate(agents)
    )
    return (
        f'<div class="anb-agents" data-agents="{len(agents)}" style="font-size:11px;margin:4px 0">'
        f"<b>Agents</b> (the <code>model</code> name each call sent; each trains against its own "
        f"group baseline): {items}</div>"
    )


# ----------------------------------------------------------------------------------- tree
def tree_svg(
    tree: TreeModel, selected: str | None = None, rewards: dict[str, tuple[float | None, float]] | None = None
) -> str:
    """The tree as SVG. `rewards` overrides (raw, discounted) per node (the reward view)."""
    if not tree.nodes:
        return '<div class="anb-tree anb-empty" data-nodes="0">no calls yet</div>'
    width = int(PAD * 2 + max(tree.columns, 1) * COL_W)
    height = int(PAD * 2 + tree.rows * ROW_H)
    pos = {n.id: (PAD + n.x * COL_W, PAD + n.y * ROW_H) for n in tree.nodes}
    parts = [
        f'<svg class="anb-tree" data-nodes="{len(tree.nodes)}" data-pending="{tree.n_pending}" '
        f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{_FONT};font-size:11px">'
    ]
    for parent, child in tree.edges:
        (px, py), (cx, cy) = pos[parent], pos[child]
        parts.append(
            f'<line class="anb-edge" x1="{px + NODE_W / 2}" y1="{py + NODE_H}" x2="{cx + NODE_W / 2}" '
            f'y2="{cy}" stroke="#555" stroke-width="1.5"><title>{esc(parent)} → {esc(child)}</title></line>'
        )
    for n in tree.nodes:
        x, y = pos[n.id]
        raw, now = rewards[n.id] if rewards and n.id in rewards else (n.reward_raw, n.reward)
        parts.append(_node_svg(n, x, y, n.id == selected, raw, now))
    parts.append("</svg>")
    return _agents_legend_html(tree.agents) + "".join(parts)


def _node_svg(n: TreeNode, x: float, y: float, selected: bool, raw: float | None, now: float | None) -> str:
    fill = "#eeeeee" if n.pending else ("#e3f0ff" if not n.concat_leaf else "#dff5e1")
    dash = ' stroke-dasharray="5,3"' if n.pending else ""
    stroke_w = 3 if selected else 1.5
    leaf_mark = " ◆leaf" if n.concat_leaf else ""
    lines = [
        f"{n.label} · {n.roles or '-'}{leaf_mark}",
        "⏳ pending…" if n.pending else n.preview,
        f"in {fmt(n.tokens_in)} · out {fmt(n.tokens_out)} · {n.versions}",
        f"r set {fmt(raw)} → {fmt(now)}",
    ]
    inset = 0 if n.agent_index is None else 8  # room for the agent's colour bar
    text = "".join(
        f'<text x="{x + 6 + inset}" y="{y + 16 + 16 * i}" class="anb-line-{i}">{esc(line[:30])}</text>'
        for i, line in enumerate(lines)
    )
    agent_attr, agent_bar = "", ""
    if n.agent_index is not None:
        agent_attr = f' data-agent="{esc(n.agent)}"'
        agent_bar = (
            f'<rect class="anb-agent-bar" x="{x + 1}" y="{y + 1}" width="8" height="{NODE_H - 2}" rx="3" '
            f'fill="{agent_colour(n.agent_index)}"/>'
        )
    return (
        f'<g class="anb-node{" anb-pending" if n.pending else ""}{" anb-leaf" if n.concat_leaf else ""}" '
        f'data-node-id="{esc(n.id)}" data-pending="{int(n.pending)}" data-reward="{fmt(now)}"{agent_attr}>'
        f"<title>{esc(n.title)}</title>"
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" stroke="#333" '
        f'stroke-width="{stroke_w}"{dash}/>{agent_bar}{text}</g>'
    )


TREE_LEGEND = (
    '<div class="anb-legend" style="font-size:11px;margin:4px 0">'
    '<b>Legend:</b> solid box = completed call · <span style="border:1px dashed #333;padding:0 3px">dashed grey '
    "box</span> = pending (in flight) · ◆leaf (green) = concat leaf, exported as a training row · "
    '"r set a → b" = reward as set → reward after discount · v = policy version(s) of the reply · '
    "hover a node for details</div>"
)


def messages_html(interaction: Any) -> str:
    rows = []
    for m in list(interaction.messages or []) + list(interaction.output_message_list or []):
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        extra = f" tool_calls={esc(m['tool_calls'])}" if m.get("tool_calls") else ""
        rows.append(
            f'<div class="anb-msg" data-role="{esc(m.get("role"))}" style="margin:2px 0">'
            f'<b>{esc(m.get("role", "?"))}</b>{extra}: <span style="white-space:pre-wrap">{esc(content or "")}</span></div>'
        )
    if interaction.output_message_list is None:
        rows.append('<div class="anb-msg anb-pending"><i>reply pending…</i></div>')
    return '<div class="anb-messages">' + "".join(rows) + "</div>"


# ----------------------------------------------------------------------------------- tokens
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
    body = f'<div class="anb-row" data-style="{esc(row.style)}"{agent_attr} style="{_FONT};font-size:12px;line-height:2">{"".join(bands)}</div>'
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
        f'<div class="anb-drift-check" data-drift="{d.first_difference}" style="font-size:11px;{_FONT}">'
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
        + _agents_legend_html(model.agents)
        + "".join(
            _row_html(
                r, model.agents.index(r.agent) if model.multi_agent and r.agent in model.agents else None
            )
            for r in model.rows
        )
        + "</div>"
    )


# ----------------------------------------------------------------------------------- rewards
def reward_html(state: RewardViewState) -> str:
    focus = {n.id: (n.raw, n.discounted) for n in state.nodes if n.episode == state.focus}
    head = (
        f'<div class="anb-reward-head" data-gamma="{state.gamma:g}" data-mode="{esc(state.mode)}" style="font-size:12px">'
        f"discount γ = <b>{state.gamma:g}</b>, mode <b>{esc(state.mode)}</b>, export <b>{esc(state.style)}</b>, "
        f'credit <b class="anb-credit" data-credit="{esc(state.credit)}">{esc(state.credit)}</b>'
        + (
            f" (normalised per {'turn index' if state.credit_norm == 'turn' else 'episode'})"
            if state.credit == "turn"
            else ""
        )
        + "</div>"
    )
    table = [
        '<table class="anb-adv" style="font-size:11px;border-collapse:collapse">'
        "<tr><th>episode</th><th>sample</th><th>row (interaction)</th><th>reward after discount</th>"
        "<th>advantage (normalised per group and agent)</th><th>per turn: return trained on → advantage</th></tr>"
    ]
    agents = list(dict.fromkeys(r.agent for r in state.rows))
    for r in state.rows:
        who = f"{r.agent}: " if len(agents) > 1 else ""
        turns = " · ".join(
            f'<span class="anb-row-turn" data-turn="{t.turn}" data-trained-on="{t.trained_on:.4g}" '
            f'data-advantage="{t.advantage:+.4f}" title="{esc(t.interaction_id)}: own return {t.turn_return:.4g}, '
            f'{fmt(t.n_tokens)} trained tokens">{esc(t.label)}</span>'
            for t in r.turns
        )
        table.append(
            f'<tr class="anb-adv-row" data-id="{esc(r.interaction_id)}"><td>{r.episode}</td><td>{fmt(r.sample_id)}</td>'
            f'<td>{esc(who + r.interaction_id)}</td><td class="anb-reward">{r.reward:.4f}</td>'
            f'<td class="anb-advantage">{r.advantage:+.4f}</td><td class="anb-adv-turns">{turns}</td></tr>'
        )
    table.append("</table>")
    silent = (
        '<div class="anb-zero-signal" style="font-size:12px;margin:4px 0;padding:2px 6px;border:2px solid #e67e00;'
        'background:#fff4e0">⚠ <b>no signal</b>: every row of this group has the same reward, so every '
        "advantage is 0 and the group does not move the policy (a larger group_size, or "
        "actor.dynamic_sampling, which drops such groups)</div>"
        if state.zero_signal
        else ""
    )
    return (
        '<div class="anb-rewards">'
        + head
        + silent
        + tree_svg(state.tree, rewards=focus)
        + TREE_LEGEND
        + "".join(table)
        + "</div>"
    )


# ----------------------------------------------------------------------------------- dashboard
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


# ----------------------------------------------------------------------------------- loss
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
        f'<div class="anb-row anb-loss-row" data-row="{row.index}"{agent_attr} style="{_FONT};font-size:12px;line-height:2">'
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
        + _agents_legend_html(getattr(model, "agents", []))
        + rows
        + "</div>"
    )

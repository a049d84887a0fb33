"""The conversation tree as SVG (one box per call, an edge per continuation) and a call's messages."""

from __future__ import annotations

from typing import Any

from ..tree_model import TreeModel, TreeNode
from .markup import FONT, agent_colour, agents_legend_html, esc, fmt

NODE_W, NODE_H, COL_W, ROW_H, PAD = 176, 74, 192, 104, 12


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
        f'viewBox="0 0 {width} {height}" style="{FONT};font-size:11px">'
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
    return agents_legend_html(tree.agents) + "".join(parts)


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

"""What every view's markup shares: escaping, number formatting, the monospace font, and one
colour per agent of a multi-agent episode (every coloured mark also names its agent in text).
"""

from __future__ import annotations

import html
from typing import Any


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def fmt(v: float | None, digits: int = 4) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


FONT = "font-family:ui-monospace,Menlo,Consolas,monospace"


# By the agent's place in order of first appearance.
_AGENT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def agent_colour(index: int) -> str:
    return _AGENT_COLOURS[index % len(_AGENT_COLOURS)]


def agents_legend_html(agents: list[str | None]) -> str:
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

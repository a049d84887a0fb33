"""HTML/SVG for every view: used inside the widgets and as the static fallback (nbconvert, GitHub).

Inline styles only (no <style> blocks) so the markup survives sanitisers. Nothing relies on colour
alone: shapes differ (dashed = pending / not trained), text labels say it, and every element has
a hover title.

One module per view (`tree`, `tokens`, `rewards`, `dashboard`, `loss`) on what they share
(`markup`: escaping, numbers, the font, the agents' colours); import them from here.
"""

from __future__ import annotations

from .dashboard import batch_table_html, dashboard_html
from .loss import loss_view_html
from .markup import FONT, agent_colour, agents_legend_html, esc, fmt
from .rewards import reward_html
from .tokens import token_view_html
from .tree import COL_W, NODE_H, NODE_W, PAD, ROW_H, TREE_LEGEND, messages_html, tree_svg

__all__ = [
    "COL_W",
    "FONT",
    "NODE_H",
    "NODE_W",
    "PAD",
    "ROW_H",
    "TREE_LEGEND",
    "agent_colour",
    "agents_legend_html",
    "batch_table_html",
    "dashboard_html",
    "esc",
    "fmt",
    "loss_view_html",
    "messages_html",
    "reward_html",
    "token_view_html",
    "tree_svg",
]

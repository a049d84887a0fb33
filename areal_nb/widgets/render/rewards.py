"""The reward view: the focused episode's tree with rewards as set and after discount, and the
group's rows with their advantages, per row and per turn.
"""

from __future__ import annotations

from ..reward_model import RewardViewState
from .markup import esc, fmt
from .tree import TREE_LEGEND, tree_svg


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

"""The conversation tree as plain data: one node per call, laid out root above children."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .sources import collect_interactions, is_complete, node_key, raw_reward

_PREVIEW_CHARS = 48


@dataclass
class TreeNode:
    id: str
    parent_id: str | None
    depth: int  # turn index along its branch (root call = 0)
    roles: str  # roles of the messages this call added, e.g. "system,user"
    preview: str  # start of the reply ("…" while pending)
    reply: str  # the full reply text
    pending: bool
    tokens_in: int | None
    tokens_out: int | None
    version_min: int | None
    version_max: int | None
    stop_reason: str | None
    reward_raw: float | None  # as set, before discount (None if not recorded)
    reward: float | None  # the interaction's reward now (after discount once applied)
    concat_leaf: bool  # exported by `export_interactions("concat")`
    chat_template_type: str
    agent: str | None = None  # the agent that made the call (the `model` name it sent)
    # its agent's place among the tree's agents when there are several (None: one agent, not shown)
    agent_index: int | None = None
    children: list[str] = field(default_factory=list)
    x: float = 0.0  # layout column (leaves take consecutive columns)
    y: int = 0  # layout row (= depth)

    @property
    def label(self) -> str:
        return f"turn {self.depth}" if self.agent_index is None else f"{self.agent} · turn {self.depth}"

    @property
    def versions(self) -> str:
        if self.version_min is None:
            return "–"
        if self.version_min == self.version_max:
            return f"v{self.version_min}"
        return f"v{self.version_min}–{self.version_max}"

    @property
    def title(self) -> str:
        """Hover text: everything the node's colour and shape say, in words."""
        state = "pending (in flight)" if self.pending else f"done ({self.stop_reason})"
        lines = [
            f"{self.id} — {self.label} ({self.roles or 'no new messages'}), {state}",
            *([f"agent: {self.agent}"] if self.agent is not None else []),
            f"tokens in/out: {_fmt(self.tokens_in)}/{_fmt(self.tokens_out)}, versions {self.versions}",
            f"reward set: {_fmt_r(self.reward_raw)}, reward now: {_fmt_r(self.reward)}",
        ]
        if self.concat_leaf:
            lines.append("concat leaf: exported as a training row")
        if self.reply:
            lines.append(f"reply: {self.reply[:200]}")
        return "\n".join(lines)


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


_Node = TypeVar("_Node", bound=_Identified)


def node_by_id(nodes: Sequence[_Node], node_id: str, kind: str, place: str) -> _Node:
    """The node of `nodes` with id `node_id`; a KeyError that lists the ids there otherwise."""
    for n in nodes:
        if n.id == node_id:
            return n
    raise KeyError(f"no {kind} {node_id!r} in this {place} ({kind}s: {[n.id for n in nodes]})")


@dataclass
class TreeModel:
    nodes: list[TreeNode]
    roots: list[str]
    edges: list[tuple[str, str]]
    columns: float  # width of the layout in columns
    rows: int  # depth + 1
    # the agents of the calls, in order of first appearance (several: the views name and colour them)
    agents: list[str | None] = field(default_factory=list)

    @property
    def multi_agent(self) -> bool:
        return len(self.agents) > 1

    def node(self, node_id: str) -> TreeNode:
        return node_by_id(self.nodes, node_id, "node", "tree")

    @property
    def n_pending(self) -> int:
        return sum(n.pending for n in self.nodes)


def _fmt(v: int | None) -> str:
    return "–" if v is None else str(v)


def _fmt_r(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def reply_text(interaction: Any) -> str:
    outputs = interaction.output_message_list
    if not outputs:
        return ""
    parts = []
    for message in outputs:
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content:
            parts.append(str(content))
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {})
            parts.append(f"[tool call {fn.get('name')}({fn.get('arguments', '')})]")
    return "\n".join(parts)


def _added_roles(interaction: Any) -> str:
    try:
        added = interaction.remaining_messages
    except (ValueError, AttributeError, TypeError):
        added = interaction.messages or []
    return ",".join(str(m.get("role", "?")) for m in added)


def build_tree(source: Any) -> TreeModel:
    interactions = collect_interactions(source)
    ids = {id(x): node_key(x, i) for i, x in enumerate(interactions)}
    complete = [x for x in interactions if is_complete(x)]
    complete_parents = {id(x.parent) for x in complete if x.parent is not None}
    nodes: dict[str, TreeNode] = {}
    for x in interactions:
        mr = x.model_response
        pending = not is_complete(x)
        parent_id = ids.get(id(x.parent)) if x.parent is not None else None
        versions = list(mr.output_versions) if mr is not None and mr.output_versions else []
        text = reply_text(x)
        nodes[ids[id(x)]] = TreeNode(
            id=ids[id(x)],
            parent_id=parent_id,
            depth=0,
            roles=_added_roles(x),
            preview="…" if pending else _preview(text),
            reply=text,
            pending=pending,
            tokens_in=mr.input_len if mr is not None else None,
            tokens_out=mr.output_len if mr is not None and not pending else None,
            version_min=min(versions) if versions else None,
            version_max=max(versions) if versions else None,
            stop_reason=mr.stop_reason if mr is not None and not pending else None,
            reward_raw=raw_reward(x) if raw_reward(x) is not None else x.reward,
            reward=x.reward,
            concat_leaf=(not pending and x.chat_template_type == "concat" and id(x) not in complete_parents),
            chat_template_type=x.chat_template_type,
            agent=getattr(x, "agent", None),
        )
    edges = []
    for n in nodes.values():
        if n.parent_id is not None and n.parent_id in nodes:
            nodes[n.parent_id].children.append(n.id)
            edges.append((n.parent_id, n.id))
        else:
            n.parent_id = n.parent_id if n.parent_id in nodes else None
    roots = [n.id for n in nodes.values() if n.parent_id is None]
    next_column = [0.0]

    def place(node_id: str, depth: int) -> float:
        node = nodes[node_id]
        node.depth = node.y = depth
        if not node.children:
            node.x = next_column[0]
            next_column[0] += 1
        else:
            xs = [place(c, depth + 1) for c in node.children]
            node.x = (xs[0] + xs[-1]) / 2
        return node.x

    for r in roots:  # several roots side by side, in insertion order
        place(r, 0)
    rows = 1 + max((n.depth for n in nodes.values()), default=-1)
    agents = list(dict.fromkeys(n.agent for n in nodes.values()))
    if len(agents) > 1:
        for n in nodes.values():
            n.agent_index = agents.index(n.agent)
    return TreeModel(list(nodes.values()), roots, edges, next_column[0], rows, agents)


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW_CHARS else flat[: _PREVIEW_CHARS - 1] + "…"

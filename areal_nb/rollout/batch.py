"""RolloutBatch: the episodes of one rollout, viewable and re-exportable without generating again.

Each accepted episode keeps *every* completed call with its parent link and the reward the
agent originally set (`raw_reward`). Discounting and the export style are applied here, on
demand, so a notebook can change the discount, switch `concat`/`individual`, drop episodes,
and look at the result before training on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from areal_nb.api import (
    CREDIT_MODES,
    DISCOUNT_MODES,
    CreditMode,
    DiscountMode,
    ExportStyle,
    check_export_style,
)
from areal_nb.api.train_batch import TrainBatch
from areal_nb.capture import InteractionWithTokenLogpReward
from areal_nb.capture.cache import discounted_rewards
from areal_nb.capture.tensors import add_sampling_records, stack_token_rows
from areal_nb.errors import CallOrderError, InvalidArgumentError, NoAcceptedEpisodesError

from .executor import Episode


def _raw(it: InteractionWithTokenLogpReward) -> float | None:
    raw = getattr(it, "raw_reward", None)
    return raw if raw is not None else it.reward


def _preview(text: Any, n: int = 60) -> str:
    if isinstance(text, list):  # content parts
        text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
    text = "" if text is None else str(text)
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _message_preview(message: dict) -> str:
    """A message as one line: its text, its tool calls as `[tool call name(args)]`, a tool
    result as `[tool result] text` (so the tables show the tool turns)."""
    parts = [_preview(message.get("content"), n=10**6)] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(f"[tool call {fn.get('name')}({fn.get('arguments', '')})]")
    text = " ".join(parts)
    return _preview(f"[tool result] {text}" if message.get("role") == "tool" else text)


@dataclass
class Row:
    """One training row: the interaction it comes from and its (discounted) reward."""

    interaction: InteractionWithTokenLogpReward
    episode_index: int
    group_id: int
    reward: float

    @property
    def agent(self) -> str | None:
        """The agent that made the row's call (the `model` name it sent)."""
        return self.interaction.agent


@dataclass
class RolloutBatch:
    episodes: list[Episode]
    style: ExportStyle = "individual"
    discount: float = 1.0
    discount_mode: DiscountMode = "tree"
    version: int = 0  # engine version when the batch was handed out
    stats: dict[str, float] = field(default_factory=dict)
    tokenizer: Any = field(default=None, repr=False)  # decodes token chips in the widgets
    # Which return each generated token trains on: the row's reward ("leaf") or its own turn's
    # discounted return ("turn"); the trainer takes it as `Actor.train_step(..., credit=)`.
    credit: CreditMode = "leaf"
    # Draws `show_tree` / `show_tokens` / `show_rewards`: `viewer(batch, name, i)`. The views live in
    # `areal_nb.widgets`, a layer above this one, so the batch is handed its viewer by whoever
    # builds it: the Session gives every batch `areal_nb.widgets.view_batch`.
    viewer: _BatchViewer | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_export_style(self.style)
        if self.discount_mode not in DISCOUNT_MODES:
            raise InvalidArgumentError(
                f"discount_mode must be one of {DISCOUNT_MODES}, got {self.discount_mode!r}"
            )
        if self.credit not in CREDIT_MODES:
            raise InvalidArgumentError(f"credit must be one of {CREDIT_MODES}, got {self.credit!r}")

    # ---------------------------------------------------------------- episodes and trees
    @property
    def accepted(self) -> list[Episode]:
        return [ep for ep in self.episodes if ep.accepted]

    @property
    def rejected(self) -> list[Episode]:
        return [ep for ep in self.episodes if not ep.accepted]

    @property
    def groups(self) -> dict[int, list[Episode]]:
        out: dict[int, list[Episode]] = {}
        for ep in self.episodes:
            out.setdefault(ep.group_id, []).append(ep)
        return out

    def calls(self, episode_index: int) -> list[InteractionWithTokenLogpReward]:
        ep = self.episodes[episode_index]
        return [it for it in (ep.interactions or {}).values() if it.is_complete]

    def trees(self, episode_index: int) -> list[InteractionWithTokenLogpReward]:
        """The root calls of one episode (follow children with `children_of`)."""
        calls = self.calls(episode_index)
        ids = {id(c) for c in calls}
        return [c for c in calls if c.parent is None or id(c.parent) not in ids]

    def children_of(self, episode_index: int, call: InteractionWithTokenLogpReward) -> list:
        return [c for c in self.calls(episode_index) if c.parent is call]

    def discounted(self, episode_index: int) -> dict[str | None, float]:
        """Reward of each call of the episode after propagation with this batch's settings."""
        calls = self.calls(episode_index)
        return discounted_rewards(
            calls, self.discount, self.discount_mode, rewards={c.interaction_id: _raw(c) for c in calls}
        )

    def episode_return(self, episode_index: int) -> float:
        """Sum of the rewards the agent set in the episode (before discount)."""
        return float(sum(_raw(c) or 0.0 for c in self.calls(episode_index)))

    # ---------------------------------------------------------------- agents
    @property
    def agents(self) -> list[str | None]:
        """The agents of the accepted episodes' calls, in order of first appearance (None: calls
        that sent no `model`). One entry for a single-agent run."""
        seen: dict[str | None, None] = {}
        for i, ep in enumerate(self.episodes):
            if ep.accepted:
                for c in self.calls(i):
                    seen.setdefault(c.agent, None)
        return list(seen)

    def agent_returns(self, episode_index: int) -> dict[str | None, float]:
        """Sum of the rewards each agent's calls got in the episode (before discount)."""
        out: dict[str | None, float] = {}
        for c in self.calls(episode_index):
            out[c.agent] = out.get(c.agent, 0.0) + (_raw(c) or 0.0)
        return out

    def agent_reward_means(self) -> dict[str | None, float]:
        """Per agent, the mean over accepted episodes of `agent_returns` (an episode in which an
        agent made no call does not count for it)."""
        sums: dict[str | None, list[float]] = {}
        for i, ep in enumerate(self.episodes):
            if ep.accepted:
                for agent, value in self.agent_returns(i).items():
                    sums.setdefault(agent, []).append(value)
        return {agent: sum(v) / len(v) for agent, v in sums.items()}

    # ---------------------------------------------------------------- rows and tensors
    def rows(self) -> list[Row]:
        out: list[Row] = []
        for i, ep in enumerate(self.episodes):
            if not ep.accepted:
                continue
            calls = self.calls(i)
            rewards = self.discounted(i)
            if self.style == "concat":
                check_export_style("concat", {str(c.interaction_id): c.chat_template_type for c in calls})
                parents = {id(c.parent) for c in calls if c.parent is not None}
                calls = [c for c in calls if id(c) not in parents]
            out.extend(Row(c, i, ep.group_id, rewards[c.interaction_id]) for c in calls)
        return out

    def to_tensors(self) -> TrainBatch:
        """The step's `TrainBatch`: right-padded [B, L] tensors, plus `group_ids`, `agent_ids` and
        `episode_ids` [B].

        Both credits' inputs, with this batch's discount: `rewards [B]` (each row's reward) and
        `turn_returns [B, L]` (each generated token's own turn's return).

        A group is a (prompt, agent) pair: `group_ids[b] = group · A + agent_ids[b]`, with A the
        number of agents and `agent_ids[b]` the row's agent's index in `self.agents`. Every
        baseline (GRPO's group mean and std, RLOO's leave-one-out, DAPO's constant-group check)
        then compares an agent's rows only with the same agent's rows of the same prompt. With
        one agent, `group_ids` are the episodes' group ids.
        """
        rows = self.rows()
        if not rows:
            reasons = sorted({str(ep.rejection_reason) for ep in self.rejected})
            why = (
                f": its {len(self.rejected)} episode(s) were rejected ({'; '.join(reasons[:5])})"
                if reasons
                else ""
            )
            raise NoAcceptedEpisodesError(f"this batch has no accepted episodes to train on{why}")
        # One tensor per field from the rows' token lists (`stack_token_rows`), with this batch's
        # rewards and returns: this runs in every training step (tests/rollout/test_batch_tensors.py
        # checks it equals `concat_padded_tensors` of the rows' `to_tensor_dict()`s).
        returns: dict[int, dict[str | None, float]] = {}
        token_rows, turn_returns = [], []
        for row in rows:
            if row.episode_index not in returns:
                returns[row.episode_index] = self.discounted(row.episode_index)
            token_rows.append(row.interaction.token_row())
            turn_returns.append(row.interaction.turn_returns(returns[row.episode_index]))
        tensors: dict[str, Any] = stack_token_rows(token_rows, [r.reward for r in rows], turn_returns)
        add_sampling_records(tensors, token_rows, [row.interaction.sampling_spans() for row in rows])
        agents = {agent: k for k, agent in enumerate(self.agents)}
        agent_ids = [agents[r.agent] for r in rows]
        return TrainBatch(
            **tensors,
            agent_ids=torch.tensor(agent_ids, dtype=torch.long),
            group_ids=torch.tensor(
                [r.group_id * len(agents) + a for r, a in zip(rows, agent_ids, strict=True)], dtype=torch.long
            ),
            episode_ids=torch.tensor([r.episode_index for r in rows], dtype=torch.long),
        )

    # ---------------------------------------------------------------- editing
    def reexport(
        self,
        discount: float | None = None,
        style: ExportStyle | None = None,
        discount_mode: DiscountMode | None = None,
        credit: CreditMode | None = None,
    ) -> RolloutBatch:
        """The same episodes with other export settings or credit; nothing is generated again."""
        return dataclasses.replace(
            self,
            discount=self.discount if discount is None else discount,
            style=self.style if style is None else style,
            discount_mode=self.discount_mode if discount_mode is None else discount_mode,
            credit=self.credit if credit is None else credit,
            stats=dict(self.stats),
        )

    def filter(self, keep: Callable[[Episode], bool]) -> RolloutBatch:
        return dataclasses.replace(
            self, episodes=[ep for ep in self.episodes if keep(ep)], stats=dict(self.stats)
        )

    # ---------------------------------------------------------------- tables
    @property
    def interactions_df(self):
        import pandas as pd

        exported = {id(r.interaction) for r in self.rows()}
        records = []
        for i, ep in enumerate(self.episodes):
            if not ep.accepted:
                continue
            rewards = self.discounted(i)
            for c in self.calls(i):
                mr = c.model_response
                versions = list(mr.output_versions) if mr is not None else []
                last_input: dict[str, Any] = next(
                    (m for m in reversed(c.messages) if m.get("role") != "assistant"), {}
                )
                reply = (c.output_message_list or [{}])[0]
                records.append(
                    {
                        "episode": i,
                        "group": ep.group_id,
                        "sample": ep.sample_id,
                        "agent": c.agent,
                        "interaction_id": c.interaction_id,
                        "parent_id": c.parent_id,
                        "turn": c.depth,
                        "prompt_preview": _message_preview(last_input),
                        "reply_preview": _message_preview(reply),
                        "reward": _raw(c),
                        "reward_discounted": rewards[c.interaction_id],
                        "input_tokens": mr.input_len if mr is not None else None,
                        "output_tokens": mr.output_len if mr is not None else None,
                        "version_min": min(versions) if versions else None,
                        "version_max": max(versions) if versions else None,
                        "stop_reason": mr.stop_reason if mr is not None else None,
                        "exported": id(c) in exported,
                    }
                )
        return pd.DataFrame.from_records(records)

    @property
    def episodes_df(self):
        import pandas as pd

        return pd.DataFrame.from_records(
            [
                {
                    "episode": i,
                    "group": ep.group_id,
                    "sample": ep.sample_id,
                    "accepted": ep.accepted,
                    "calls": len(self.calls(i)) if ep.accepted else 0,
                    "return": self.episode_return(i) if ep.accepted else None,
                    "rejection_reason": ep.rejection_reason,
                }
                for i, ep in enumerate(self.episodes)
            ]
        )

    def __repr__(self) -> str:
        return (
            f"RolloutBatch({len(self.episodes)} episodes, {len(self.accepted)} accepted, "
            f"style={self.style!r}, discount={self.discount}, discount_mode={self.discount_mode!r}, "
            f"credit={self.credit!r}, version={self.version})"
        )

    # ---------------------------------------------------------------- views
    def show_tree(self, i: int = 0):
        """Conversation tree of episode `i` (live widget from `areal_nb.widgets`)."""
        return self._view("tree", i)

    def show_tokens(self, i: int = 0):
        """Token chips of episode `i`: loss mask, log-prob heat, turns, drift check."""
        return self._view("tokens", i)

    def show_rewards(self, i: int = 0):
        """Reward propagation of episode `i` with its group's advantages and this batch's settings."""
        return self._view("rewards", i)

    def _view(self, name: _BatchViewName, i: int):
        if self.viewer is None:
            raise CallOrderError(
                f"batch.show_{name}() needs the widgets, and this batch was built without them (a Session's "
                "batches have them): `batch.viewer = areal_nb.widgets.view_batch`, or call "
                f"`areal_nb.widgets.show_{name}(...)` directly"
            )
        return self.viewer(self, name, i)


_BatchViewName = Literal["tree", "tokens", "rewards"]
_BatchViewer = Callable[["RolloutBatch", _BatchViewName, int], Any]

"""`InteractionWithTokenLogpReward`: one recorded LLM call and its training row.

A row holds exactly the tokens the engine saw and produced. In `concat` mode a child call's
prompt starts with its parent's tokens (see `templates.concat_prompt_token_ids_with_parent`),
so the child's row reuses the parent's row for that prefix: the parent's generated tokens keep
loss_mask 1, and the gap the parent did not generate (tool results, user turns, the EOS added
after a length-truncated parent) gets loss_mask 0.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_nb.api import CHAT_TEMPLATE_TYPES, ChatTemplateType, ModelResponse, SamplingSpan
from areal_nb.errors import ArgumentTypeError, ExportError, IncompleteInteractionError, InvalidArgumentError

from .tensors import stack_token_rows


def checked_reward(reward: Any) -> float:
    """A reward as float: ints and floats are accepted, bools and non-finite values are not."""
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise ArgumentTypeError(f"reward must be an int or float, got {type(reward).__name__}: {reward!r}")
    value = float(reward)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"reward must be finite, got {value}")
    return value


@dataclass
class TokenRow:
    """Per-token lists of one training row (no batch dimension)."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    turn_ids: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(eq=False)
class InteractionWithTokenLogpReward:
    """One LLM call: input messages, output message(s), exact tokens, reward and tree parent.

    `output_message_list` is None while the call is in flight; such an interaction is never a
    parent, never a reward target of `set_last_reward`, and is skipped at export.
    """

    model_response: ModelResponse | None = None
    reward: float | None = None
    # the reward as the agent set it (0.0 if unset), recorded when a discount replaces `reward`
    raw_reward: float | None = None
    parent: InteractionWithTokenLogpReward | None = None
    chat_template_type: ChatTemplateType = "hf"
    messages: list[dict[str, Any]] = field(default_factory=list)
    output_message_list: list[dict[str, Any]] | None = None
    completion: Any = None  # openai ChatCompletion, or Completion for a text completion
    response: Any = None  # openai Response
    input_data: Any = ""  # the raw Responses `input`
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Which agent made the call: the `model` name it sent (None: it sent none). Several agents
    # of one episode each have their own conversation trees and their own advantage baselines.
    agent: str | None = None
    _interaction_id: str | None = None
    created_at: float = field(default_factory=time.time)
    # Rebuilt from the wire without its parent: the row as exported (see `from_wire`).
    _frozen_row: TokenRow | None = field(default=None, repr=False)
    _wire_parent_id: str | None = field(default=None, repr=False)
    # Token lists only (never rewards): (model_response, parent row, template type, row).
    _row_memo: tuple | None = field(default=None, repr=False)
    # Rebuilt without its parent: the per-token turn returns as exported (ancestors unknown here).
    _frozen_turn_returns: list[float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.chat_template_type not in CHAT_TEMPLATE_TYPES:
            raise InvalidArgumentError(
                f"chat_template_type must be one of {CHAT_TEMPLATE_TYPES}, got {self.chat_template_type!r}"
            )
        if self.reward is not None:
            self.reward = checked_reward(self.reward)

    # ----- identity -----------------------------------------------------------------------
    @property
    def interaction_id(self) -> str | None:
        if self.completion is not None:
            return self.completion.id
        if self.response is not None:
            return self.response.id
        return self._interaction_id

    @interaction_id.setter
    def interaction_id(self, value: str) -> None:
        if self.completion is not None or self.response is not None:
            raise InvalidArgumentError(
                "Cannot set the ID of an interaction that has a completion or response"
            )
        self._interaction_id = value

    @property
    def parent_id(self) -> str | None:
        return self.parent.interaction_id if self.parent is not None else self._wire_parent_id

    @property
    def is_completion(self) -> bool:
        return self.completion is not None

    @property
    def is_text_completion(self) -> bool:
        """A `/v1/completions` call: its prompt is text without a chat template, so it is linked
        only to other text completions (`text_completion.find_text_parent`)."""
        return self.completion is not None and getattr(self.completion, "object", None) == "text_completion"

    @property
    def is_response(self) -> bool:
        return self.response is not None

    @property
    def is_complete(self) -> bool:
        """True once the call returned (its output messages are recorded)."""
        return self.output_message_list is not None and self.interaction_id is not None

    @property
    def has_tensor_data(self) -> bool:
        return self.model_response is not None or self._frozen_row is not None

    @property
    def depth(self) -> int:
        """Number of ancestors: 0 for a root call, 1 for its child, ..."""
        n, node = 0, self.parent
        while node is not None:
            n, node = n + 1, node.parent
        return n

    @property
    def remaining_messages(self) -> list[dict[str, Any]]:
        """The messages this call added after its parent's messages and output."""
        if self.parent is None:
            return self.messages
        if self.parent.output_message_list is None:
            raise IncompleteInteractionError(
                f"parent {self.parent.interaction_id} of {self.interaction_id} has no output yet"
            )
        return self.messages[len(self.parent.messages) + len(self.parent.output_message_list) :]

    # ----- training row -------------------------------------------------------------------
    def _own_row(self, mr: ModelResponse, first_turn_id: int) -> TokenRow:
        n_in, n_out = mr.input_len, mr.output_len
        return TokenRow(
            input_ids=list(mr.input_tokens) + list(mr.output_tokens),
            loss_mask=[0] * n_in + [1] * n_out,
            logprobs=[0.0] * n_in + [float(x) for x in mr.output_logprobs],
            versions=[-1] * n_in + [int(v) for v in mr.output_versions],
            turn_ids=[-1] * n_in + [first_turn_id] * n_out,
        )

    def _concat_row(
        self, mr: ModelResponse, parent: InteractionWithTokenLogpReward, parent_row: TokenRow
    ) -> TokenRow:
        prompt = mr.input_tokens
        # The parent's trailing EOS/pad run is stripped and one EOS added when building the
        # child's prompt, so the shared prefix may end a few tokens before the parent's row.
        shared = 0
        limit = min(len(parent_row), len(prompt))
        while shared < limit and parent_row.input_ids[shared] == prompt[shared]:
            shared += 1
        required = self._parent_prefix_len(parent)
        if shared < required:
            raise ExportError(
                f"concat row of interaction {self.interaction_id}: its prompt does not start with "
                f"its parent's tokens (first difference at token {shared}, parent row covers "
                f"{required} tokens); was it generated in concat mode from this parent?"
            )
        gap = len(prompt) - shared
        turn = (max(parent_row.turn_ids[:shared], default=-1)) + 1
        return TokenRow(
            input_ids=list(prompt) + list(mr.output_tokens),
            loss_mask=parent_row.loss_mask[:shared] + [0] * gap + [1] * mr.output_len,
            logprobs=parent_row.logprobs[:shared] + [0.0] * gap + [float(x) for x in mr.output_logprobs],
            versions=parent_row.versions[:shared] + [-1] * gap + [int(v) for v in mr.output_versions],
            turn_ids=parent_row.turn_ids[:shared] + [-1] * gap + [turn] * mr.output_len,
        )

    @staticmethod
    def _parent_prefix_len(parent: InteractionWithTokenLogpReward) -> int:
        pr = parent.model_response
        if pr is None:  # rebuilt from the wire: trust the exported row
            return len(parent.token_row())
        try:
            return pr.input_len + len(pr.output_tokens_without_stop)
        except ValueError:
            return pr.input_len + pr.output_len

    def token_row(self) -> TokenRow:
        """This call's row as plain lists (memoised; rewards are not part of it)."""
        if self._frozen_row is not None:
            return self._frozen_row
        if self.model_response is None:
            raise IncompleteInteractionError(
                f"interaction {self.interaction_id} has no model_response (no token data)"
            )
        mr = self.model_response
        _check_response_lengths(mr, self.interaction_id)
        parent = self.parent if self.chat_template_type == "concat" else None
        parent_row = parent.token_row() if parent is not None else None
        memo = self._row_memo
        if (
            memo is not None
            and memo[0] is self.model_response
            and memo[1] is parent_row
            and memo[2] == self.chat_template_type
        ):
            return memo[3]
        if parent is not None and parent_row is not None:
            row = self._concat_row(mr, parent, parent_row)
        else:
            row = self._own_row(mr, self.depth)
        self._row_memo = (self.model_response, parent_row, self.chat_template_type, row)
        return row

    def row_calls(self) -> list[InteractionWithTokenLogpReward]:
        """The calls whose generated tokens this row holds: itself, then (concat) its ancestors."""
        chain, node = [self], self
        while node._frozen_row is None and node.chat_template_type == "concat" and node.parent is not None:
            node = node.parent
            chain.append(node)
        return chain

    def sampling_spans(self) -> list[SamplingSpan]:
        """Where this row's generated tokens were sampled under a mask (grammar, top-k, top-p):
        one span per call of the row whose response recorded `sampling_masks` (a call rebuilt
        from the wire has none: its row is trained on the full vocabulary)."""
        spans = []
        for call in self.row_calls():
            response = call.model_response
            if response is None or response.sampling_masks is None:
                continue
            start = len(call.token_row()) - response.output_len  # a call's row ends with its output
            spans.append(SamplingSpan(start, response.sampling_masks, list(response.output_tokens)))
        return spans

    def turn_returns(self, rewards: Mapping[str | None, float | None] | None = None) -> list[float]:
        """Per token of `token_row()`: the reward of the call (turn) that generated it, 0.0 elsewhere.

        Read after the discount, a call's reward is its turn's return (tree rule: its own reward
        plus γ × the mean of its children's returns), so in a `concat` row each turn's tokens
        get the return of their own turn, while `rewards` (the leaf's) is one number for the
        whole row. An `hf` row holds one call: all its generated tokens get its reward.
        `rewards` (by interaction id) overrides the calls' own `reward` (e.g. a batch's
        re-discounted values); an unset reward counts as 0.0. Never memoised.
        """
        row = self.token_row()
        by_turn: dict[int, float] = {}
        for call in self.row_calls():
            reward = call.reward
            if rewards is not None and call.interaction_id in rewards:
                reward = rewards[call.interaction_id]
            own_turn = call.own_turn_id()
            if own_turn is not None:
                by_turn.setdefault(own_turn, 0.0 if reward is None else float(reward))
            if call._frozen_row is not None:  # ancestors unknown: their returns as exported
                for turn, value in zip(
                    call._frozen_row.turn_ids, call._frozen_turn_returns or [], strict=False
                ):
                    if turn >= 0:
                        by_turn.setdefault(turn, value)
        missing = sorted({t for t in row.turn_ids if t >= 0} - set(by_turn))
        if missing:
            raise ExportError(
                f"interaction {self.interaction_id}: no call known for turn(s) {missing} of its row (rebuilt "
                "from the wire without its parent and without exported turn returns?)"
            )
        return [by_turn[t] if t >= 0 else 0.0 for t in row.turn_ids]

    def own_turn_id(self) -> int | None:
        """The turn id this call's generated tokens carry in its row (None: it generated nothing)."""
        row = self.token_row()
        if not row.turn_ids or row.loss_mask[-1] == 0:
            return None
        return row.turn_ids[-1]

    def to_tensor_dict(self) -> dict[str, torch.Tensor]:
        """Training tensors with batch dimension 1; rewards are read now, never memoised.

        `rewards [1]` is this row's reward (the leaf's, for a concat row); `turn_returns [1, L]`
        gives each generated token the return of its own turn (see `turn_returns`).
        """
        reward = self.reward if self.reward is not None else 0.0
        return stack_token_rows([self.token_row()], [reward], [self.turn_returns()])

    # ----- wire format --------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """A JSON-safe dict that `from_wire` turns back into an equal interaction."""
        from .wire import interaction_to_wire

        return interaction_to_wire(self)

    @classmethod
    def from_wire(
        cls, data: dict[str, Any], parents: dict[str, InteractionWithTokenLogpReward] | None = None
    ) -> InteractionWithTokenLogpReward:
        """Rebuild from `to_wire()`; the parent is looked up by id in `parents`.

        Without its parent the interaction keeps the exported row, so `to_tensor_dict()` is
        unchanged and `parent_id` still names the parent.
        """
        from .wire import interaction_from_wire

        return interaction_from_wire(cls, data, parents or {})


def _check_response_lengths(mr: ModelResponse, interaction_id: str | None) -> None:
    n = mr.output_len
    if len(mr.output_logprobs) != n or len(mr.output_versions) != n:
        raise ExportError(
            f"interaction {interaction_id}: model_response has {n} output tokens but "
            f"{len(mr.output_logprobs)} log-probs and {len(mr.output_versions)} versions"
        )

"""`GroupedRolloutWorkflow`: `group_size` episodes of the same prompt, run concurrently.

Differences from AReaL (docs/reference/areal-semantics.md, "Resolving a workflow"): a member that
raises counts as a rejected member
(None) instead of failing the whole group, and an empty member (`{}`) is rejected too.

Result format (what the trainer reads for GRPO group normalisation):

- members returning interaction dicts → a `GroupedTrajectory`, a plain
  `dict[interaction_id, InteractionWithTokenLogpReward]` of all members merged, plus
  `episode_of[interaction_id] -> member index` (0..group_size-1) and
  `members[i]` (that member's own dict, or None when rejected). Rows per member vary.
- members returning tensor dicts (`[rows, seqlen]` each) → a `GroupedTensors`, the
  tensors concatenated along rows (right-padded with 0 along the sequence dim), plus
  `episode_of_row[r] -> member index`.
- every member rejected → None.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.errors import ArgumentTypeError, GroupMismatchError, InvalidArgumentError

logger = logging.getLogger(__name__)


class GroupedTrajectory(dict):
    """Merged interactions of one group; see the module docstring."""

    def __init__(self, members: list[dict[str, Any] | None]) -> None:
        super().__init__()
        self.members = members
        self.episode_of: dict[str, int] = {}
        for index, member in enumerate(members):
            if member is None:
                continue
            for key, value in member.items():
                if key in self:
                    raise GroupMismatchError(f"interaction id {key!r} appears in two episodes of one group")
                self[key] = value
                self.episode_of[key] = index

    def episode(self, index: int) -> dict[str, Any] | None:
        return self.members[index]


class GroupedTensors(dict):
    """Row-concatenated tensor dicts of one group; `episode_of_row[r]` is the member of row r."""

    def __init__(self, members: list[dict[str, Any] | None]) -> None:
        import torch

        super().__init__()
        self.members = members
        valid = [(i, m) for i, m in enumerate(members) if m is not None]
        keys = set(valid[0][1])
        for index, member in valid:
            if set(member) != keys:
                raise GroupMismatchError(
                    f"episode {index} returned tensor keys {sorted(member)}, episode {valid[0][0]} {sorted(keys)}"
                )
        self.episode_of_row: list[int] = []
        for index, member in valid:
            self.episode_of_row += [index] * int(member["input_ids"].shape[0])
        for key in sorted(keys):
            tensors = [m[key] for _, m in valid]
            if tensors[0].dim() == 1:
                self[key] = torch.cat(tensors)
                continue
            width = max(t.shape[1] for t in tensors)
            padded = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors]
            self[key] = torch.cat(padded)


def _is_tensor_dict(result: dict[str, Any]) -> bool:
    return "input_ids" in result and hasattr(result["input_ids"], "shape")


class GroupedRolloutWorkflow(RolloutWorkflow):
    def __init__(self, workflow: RolloutWorkflow, group_size: int) -> None:
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            raise InvalidArgumentError(f"group_size must be an int >= 1, got {group_size!r}")
        if not isinstance(workflow, RolloutWorkflow):
            raise ArgumentTypeError(
                f"GroupedRolloutWorkflow wraps a RolloutWorkflow, got {type(workflow).__name__}"
            )
        self.workflow = workflow
        self.group_size = group_size
        self.last_member_errors: list[str] = []

    async def _member(
        self, engine: InferenceEngine, data: dict[str, Any], index: int
    ) -> dict[str, Any] | None:
        try:
            result = await self.workflow.arun_episode(engine, data)
        except Exception as exc:  # noqa: BLE001 - one member must not fail the group
            message = f"member {index} raised {type(exc).__name__}: {exc}"
            logger.warning("group member rejected: %s", message)
            self.last_member_errors.append(message)
            return None
        if result is None:
            return None
        if not isinstance(result, dict):
            message = f"member {index} returned {type(result).__name__}, expected a dict or None"
            logger.warning("group member rejected: %s", message)
            self.last_member_errors.append(message)
            return None
        return result or None  # an episode with no LLM call is a rejected one, not an empty row set

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any] | None:
        self.last_member_errors = []
        members = list(await asyncio.gather(*(self._member(engine, data, i) for i in range(self.group_size))))
        valid = [m for m in members if m is not None]
        if not valid:
            logger.warning("all %d trajectories of the group were rejected", self.group_size)
            return None
        if len(valid) < self.group_size:
            logger.warning(
                "%d/%d trajectories of the group were rejected", self.group_size - len(valid), self.group_size
            )
        kinds = {_is_tensor_dict(m) for m in valid}
        if len(kinds) > 1:
            raise GroupMismatchError("group members returned a mix of tensor dicts and interaction dicts")
        if kinds == {True}:
            return GroupedTensors(members)
        return GroupedTrajectory(members)

    def close(self) -> None:
        close = getattr(self.workflow, "close", None)
        if callable(close):
            close()

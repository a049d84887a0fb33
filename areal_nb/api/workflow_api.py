"""`RolloutWorkflow`: one episode of interaction with the engine for one data item."""

from __future__ import annotations

import abc
from typing import Any

from .engine_api import InferenceEngine


class RolloutWorkflow(abc.ABC):
    """Runs one episode and returns its trajectory.

    `arun_episode` returns a dict of interactions (`{id: InteractionWithTokenLogpReward}`, what
    `RolloutBatch` reads), or `None` when the trajectory is rejected (`last_rejection_reason`, if
    the workflow has one, says why). AReaL's other return, a dict of padded tensors, passes the
    executor but not `RolloutBatch`.
    """

    @abc.abstractmethod
    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> Any: ...

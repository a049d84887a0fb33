"""Rollout: which workflow runs an episode, groups of samples, the executor with staleness
control, and `RolloutBatch` (what `Session.rollout()` returns)."""

from .grouped import GroupedRolloutWorkflow, GroupedTensors, GroupedTrajectory
from .resolve import import_from_string, requires_proxy, resolve_workflow


def __getattr__(name: str):
    # The batch and the executor pull in torch and the capture layer; import them when asked for.
    if name in ("RolloutBatch", "Row"):
        from . import batch

        return getattr(batch, name)
    if name in ("RolloutExecutor", "Episode"):
        from . import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'areal_nb.rollout' has no attribute {name!r}")


__all__ = [
    "Episode",
    "GroupedRolloutWorkflow",
    "GroupedTensors",
    "GroupedTrajectory",
    "RolloutBatch",
    "RolloutExecutor",
    "Row",
    "import_from_string",
    "requires_proxy",
    "resolve_workflow",
]

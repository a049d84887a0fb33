"""Rollout: workflow resolution, grouping (executor and batch names are added alongside)."""

from .grouped import GroupedRolloutWorkflow, GroupedTensors, GroupedTrajectory
from .resolve import import_from_string, requires_proxy, resolve_workflow

__all__ = [
    "GroupedRolloutWorkflow",
    "GroupedTensors",
    "GroupedTrajectory",
    "import_from_string",
    "requires_proxy",
    "resolve_workflow",
]

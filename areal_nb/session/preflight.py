"""Before the first rollout: one greedy episode on the first training row, failing loudly.

During training an episode that raises is only *rejected* (counted and logged), which is right
for the odd bad sample but turns a systematic mistake — the agent reads a key the rows lack, the
reward function raises — into a whole batch of rejections and a confusing stall. So the Session
runs the agent once on row 0 first (greedy, through the `/eval` proxy: no training data) and
raises `FirstEpisodeError` with the row, the reason and the agent's own traceback.
"""

from __future__ import annotations

import copy
import traceback
from typing import Any

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.errors import FirstEpisodeError  # noqa: F401 (re-exported)

from .evaluation import GreedyEngine


class _TracingAgent:
    """Runs the agent inline and keeps the traceback of what it raised (the workflow keeps only the text)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.traceback: str | None = None

    async def run(self, data: dict[str, Any], **kwargs: Any) -> Any:
        try:
            return await self.agent.run(data, **kwargs)
        except Exception:
            self.traceback = traceback.format_exc()
            raise


async def check_first_episode(
    workflow: RolloutWorkflow, engine: InferenceEngine, row: dict[str, Any], *, row_index: int = 0
) -> None:
    """Run `workflow`'s agent greedily on `row`; raise `FirstEpisodeError` unless it is accepted."""
    from areal_nb.rollout.workflow import OpenAIProxyWorkflow

    tracer = None
    probe = workflow
    if isinstance(workflow, OpenAIProxyWorkflow) and workflow.mode == "inline":
        tracer = _TracingAgent(workflow.agent)
        probe = OpenAIProxyWorkflow(
            mode="inline",
            agent=tracer,
            proxy_addr=workflow.proxy_addr,
            admin_api_key=workflow.admin_api_key,
            agent_timeout=workflow.agent_timeout,
            raw_calls=workflow.raw_calls,
        )
    try:
        # a deep copy, as the executor gives every episode: the agent may change its `data` freely
        result = await probe.arun_episode(GreedyEngine(engine), copy.deepcopy(row))
        reason = (
            None
            if result
            else (getattr(probe, "last_rejection_reason", None) or "the episode returned nothing")
        )
        trace = tracer.traceback if tracer is not None else None
    except Exception as e:  # a direct RolloutWorkflow raises its own errors
        reason, trace = f"{type(e).__name__}: {e}", traceback.format_exc()
    finally:
        if probe is not workflow and hasattr(probe, "aclose"):
            await probe.aclose()
    if reason is None:
        return
    message = (
        f"the agent failed on training row {row_index} before training started: {reason}\n"
        f"row {row_index} has keys {sorted(row, key=str)}"
    )
    if trace:
        message += f"\n\nThe agent's traceback:\n{trace}"
    raise FirstEpisodeError(message)

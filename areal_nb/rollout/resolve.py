"""`resolve_workflow`: whatever the user passed as a workflow → a `RolloutWorkflow`
(docs/reference/areal-semantics.md, "Resolving a workflow").

1. a `RolloutWorkflow` instance → used as is (`workflow_kwargs` ignored, with a warning);
2. a `RolloutWorkflow` subclass → instantiated with `workflow_kwargs` (required);
3. an import string `"pkg.mod.Name"` (or `"pkg.mod:Name"`) → imported, then resolved as 1, 2 or 4;
4. any other class, or any object with `async def run(data, **kwargs)` → an agent, wrapped in
   `OpenAIProxyWorkflow` (needs `proxy_addr` and `admin_api_key`; a class is instantiated with
   `workflow_kwargs or {}`).

`group_size > 1` wraps the result in `GroupedRolloutWorkflow`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from areal_nb.api import RolloutWorkflow
from areal_nb.api.import_path import import_named_object
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

from .grouped import GroupedRolloutWorkflow

logger = logging.getLogger(__name__)


def import_from_string(path: str) -> Any:
    """`"pkg.mod.Name"` or `"pkg.mod:Name"` → the object; ValueError saying what failed."""
    return import_named_object(
        path,
        not_a_path=f"workflow string {path!r} is not of the form 'package.module.Name'",
        import_error=InvalidArgumentError,
        cannot_import=f"Failed to import workflow from string {path!r}",
    )


def _wrap_agent(agent: Any, proxy_addr: str | None, admin_api_key: str | None, **proxy_workflow_kwargs: Any):
    from .workflow import OpenAIProxyWorkflow

    name = type(agent).__name__
    if not proxy_addr:
        raise InvalidArgumentError(
            f"proxy_addr is required for agent workflows ({name} is not a RolloutWorkflow)"
        )
    if not admin_api_key:
        raise InvalidArgumentError(
            f"admin_api_key is required for agent workflows ({name} is not a RolloutWorkflow)"
        )
    run = getattr(agent, "run", None)
    if not callable(run):
        raise ArgumentTypeError(
            f"{name} is neither a RolloutWorkflow nor an agent: it has no `async def run(data, **kwargs)` method"
        )
    return OpenAIProxyWorkflow(
        agent=agent, proxy_addr=proxy_addr, admin_api_key=admin_api_key, **proxy_workflow_kwargs
    )


def _resolve_single(
    workflow: Any,
    workflow_kwargs: dict[str, Any] | None,
    proxy_addr: str | None,
    admin_api_key: str | None,
    proxy_workflow_kwargs: dict[str, Any],
) -> RolloutWorkflow:
    if workflow is None:
        raise InvalidArgumentError(
            "workflow is None: pass a RolloutWorkflow, its class, an import string, or an agent"
        )
    if isinstance(workflow, str):
        return _resolve_single(
            import_from_string(workflow), workflow_kwargs, proxy_addr, admin_api_key, proxy_workflow_kwargs
        )
    if isinstance(workflow, RolloutWorkflow):
        if workflow_kwargs:
            logger.warning(
                "workflow is already an instance; workflow_kwargs %s are ignored", sorted(workflow_kwargs)
            )
        return workflow
    if inspect.isclass(workflow) and issubclass(workflow, RolloutWorkflow):
        if workflow_kwargs is None:
            raise InvalidArgumentError(
                f"workflow_kwargs is required when workflow is a class ({workflow.__name__}); pass {{}} for none"
            )
        return workflow(**workflow_kwargs)
    if inspect.isclass(workflow):
        if not callable(getattr(workflow, "run", None)):
            raise ArgumentTypeError(
                f"class {workflow.__name__} is neither a RolloutWorkflow nor an agent with `async def run(data, **kwargs)`"
            )
        agent = workflow(**(workflow_kwargs or {}))
    else:
        if workflow_kwargs:
            logger.warning(
                "agent is already an instance; workflow_kwargs %s are ignored", sorted(workflow_kwargs)
            )
        agent = workflow
    return _wrap_agent(agent, proxy_addr, admin_api_key, **proxy_workflow_kwargs)


def resolve_workflow(
    workflow: Any,
    workflow_kwargs: dict[str, Any] | None = None,
    group_size: int = 1,
    proxy_addr: str | None = None,
    admin_api_key: str | None = None,
    **proxy_workflow_kwargs: Any,
) -> RolloutWorkflow:
    """Resolve `workflow` (see module docstring); `proxy_workflow_kwargs` go to OpenAIProxyWorkflow
    (mode, discount, export_style, discount_mode, subproc_max_workers, agent_timeout)."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise InvalidArgumentError(f"group_size must be an int >= 1, got {group_size!r}")
    resolved = _resolve_single(workflow, workflow_kwargs, proxy_addr, admin_api_key, proxy_workflow_kwargs)
    if group_size > 1:
        return GroupedRolloutWorkflow(resolved, group_size)
    return resolved


def requires_proxy(workflow: Any) -> bool:
    """Whether `workflow` resolves to an agent (so the session must start the proxy).

    An import string that fails to import counts as needing the proxy, as in the reference:
    the error then surfaces in `resolve_workflow` with its message.
    """
    if workflow is None:
        return False
    if isinstance(workflow, str):
        try:
            workflow = import_from_string(workflow)
        except ValueError:
            return True
    if isinstance(workflow, RolloutWorkflow):
        return False
    return not (inspect.isclass(workflow) and issubclass(workflow, RolloutWorkflow))

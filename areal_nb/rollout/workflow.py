"""`OpenAIProxyWorkflow`: runs an unmodified agent against the proxy as one RL episode.

The six steps of an episode: grant capacity → start session → `agent.run` → rewards →
end session → export. The agent's return value says where rewards go:

- a number (int or float, not bool, finite) → the session's last completed call;
- `dict[interaction_id, number]` → those calls;
- anything else, an exception, a timeout, or an episode without LLM calls → the trajectory
  is rejected: `arun_episode` returns None, logs the reason and counts it in
  `self.rejections` (`last_rejection_reason` has the latest message). The session is still
  ended and exported (and the export discarded) so the proxy forgets it.

Modes: `inline` awaits `agent.run(data, base_url=<proxy>/v1, api_key=<session key>,
http_client=<shared httpx.AsyncClient>)` in the caller's loop. Given the proxy app itself
(`asgi_app`, as the Session does), an inline episode costs no socket: the lifecycle calls go
straight to the app's `ProxyState` and the agent's `http_client` calls the app in-process
(`areal_nb.proxy.inprocess`); an agent that builds its own client still reaches `base_url`
over HTTP. `subproc` runs `asyncio.run(agent.run(data))` in a spawn-context process pool
(`agent_pool.py`) with `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
`ANTHROPIC_API_KEY` set, so sync SDK code works. The workers do not run the main program again
(`areal_nb.api.spawn`); the agent and the row travel to the worker by value (cloudpickle,
`areal_nb.api.by_value`): a class defined in a notebook cell or a script works; an agent holding something that cannot travel (a lock, a
socket) is refused at construction with `NotSerializableError` naming the attribute.

Export: by default an episode returns the proxy's export (AReaL's: rewards discounted back through
the turns with `discount` / `discount_mode`, the calls of `export_style`). With `raw_calls=True`
(the Session's workflows) it returns every completed call with the rewards as the agent set them:
the `RolloutBatch` then discounts, assigns credit and styles them, once.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import inspect
import logging
import math
import numbers
import uuid
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import httpx

from areal_nb.api import (
    DISCOUNT_MODES,
    AgentRewards,
    DiscountMode,
    ExportStyle,
    InferenceEngine,
    RolloutWorkflow,
    check_export_style,
)
from areal_nb.api.by_value import dumps_by_value
from areal_nb.api.deadline import TaskAbandoned, run_within
from areal_nb.errors import (
    ArgumentTypeError,
    EpisodeRejected,  # noqa: F401 (re-exported)
    InvalidArgumentError,
)
from areal_nb.proxy.client import OpenAIProxyClient, ProxyRequestError
from areal_nb.proxy.inprocess import InProcessProxyClient, asgi_http_client, proxy_state_of
from areal_nb.proxy.state import ProxyState

from .agent_pool import AgentProcessPool
from .agent_pool import run_agent_in_subprocess as _run_agent_in_subprocess  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from areal_nb.capture import InteractionWithTokenLogpReward

logger = logging.getLogger(__name__)

_MODES = ("inline", "subproc")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def parse_agent_rewards(value: Any) -> float | dict[str, float] | AgentRewards:
    """The agent's return value as a reward, or EpisodeRejected saying what is wrong with it."""
    if isinstance(value, AgentRewards):
        if not value.per_agent:
            raise EpisodeRejected("invalid_reward", "agent returned AgentRewards for no agent")
        for agent, reward in value.per_agent.items():
            if not isinstance(agent, str) or not _is_number(reward) or not math.isfinite(float(reward)):
                raise EpisodeRejected(
                    "invalid_reward",
                    f"AgentRewards maps agent names to finite numbers, got {agent!r}: {reward!r}",
                )
        return AgentRewards({agent: float(r) for agent, r in value.per_agent.items()})
    if _is_number(value):
        reward = float(value)
        if not math.isfinite(reward):
            raise EpisodeRejected("invalid_reward", f"agent returned a non-finite reward {value!r}")
        return reward
    if isinstance(value, dict):
        if not value:
            raise EpisodeRejected("invalid_reward", "agent returned an empty reward dict")
        out: dict[str, float] = {}
        for key, reward in value.items():
            if not isinstance(key, str):
                raise EpisodeRejected(
                    "invalid_reward", f"reward dict key {key!r} is not an interaction id string"
                )
            if not _is_number(reward) or not math.isfinite(float(reward)):
                raise EpisodeRejected(
                    "invalid_reward", f"reward for {key!r} must be a finite int or float, got {reward!r}"
                )
            out[key] = float(reward)
        return out
    raise EpisodeRejected(
        "invalid_reward",
        f"agent.run must return a number, a dict {{interaction_id: number}} or AgentRewards, "
        f"got {type(value).__name__}: {value!r:.200}",
    )


async def _assigned_or_rejected(assignment: Awaitable[None], what: str | None = None) -> None:
    """Await a reward's assignment; the proxy's 400/404 (no such call or agent) rejects the episode.

    `what` names the call or agent the reward was for; None: the last call, which has no id to
    get wrong, so the session had no completed call."""
    try:
        await assignment
    except ProxyRequestError as exc:
        if exc.status not in (400, 404):
            raise
        if what is None:
            raise EpisodeRejected(
                "no_interactions", f"the agent made no LLM call through the proxy ({exc.detail})"
            ) from exc
        raise EpisodeRejected(
            "invalid_reward", f"reward for {what} could not be assigned: {exc.detail}"
        ) from exc


def _check_agent(agent: Any, mode: str) -> None:
    """InvalidArgumentError / ArgumentTypeError unless `agent` has a `run` method `mode` can call."""
    if agent is None:
        raise InvalidArgumentError(
            "OpenAIProxyWorkflow needs an agent (an object with `async def run(data, **kwargs)`)"
        )
    run = getattr(agent, "run", None)
    if not callable(run):
        raise ArgumentTypeError(f"agent {type(agent).__name__} has no callable `run(data, **kwargs)` method")
    if mode == "inline" and not inspect.iscoroutinefunction(run):
        raise ArgumentTypeError(
            f"{type(agent).__name__}.run must be `async def` in inline mode (use mode='subproc' for sync code)"
        )


class OpenAIProxyWorkflow(RolloutWorkflow):
    def __init__(
        self,
        mode: str = "inline",
        agent: Any = None,
        proxy_addr: str = "",
        admin_api_key: str = "",
        discount: float = 1.0,
        export_style: ExportStyle = "individual",
        discount_mode: DiscountMode = "tree",
        subproc_max_workers: int = 4,
        agent_timeout: float | None = None,
        asgi_app: Any = None,
        proxy_state: ProxyState | None = None,
        raw_calls: bool = False,
    ) -> None:
        if mode not in _MODES:
            raise InvalidArgumentError(f"mode must be one of {_MODES}, got {mode!r}")
        _check_agent(agent, mode)
        if not proxy_addr:
            raise InvalidArgumentError(
                "OpenAIProxyWorkflow needs proxy_addr (the proxy root, e.g. http://127.0.0.1:8000)"
            )
        if not admin_api_key:
            raise InvalidArgumentError("OpenAIProxyWorkflow needs the proxy's admin_api_key")
        check_export_style(export_style)
        if discount_mode not in DISCOUNT_MODES:
            raise InvalidArgumentError(
                f"discount_mode must be one of {DISCOUNT_MODES}, got {discount_mode!r}"
            )
        if not 0.0 <= discount <= 1.0:
            raise InvalidArgumentError(f"discount must be in [0, 1], got {discount}")
        if subproc_max_workers < 1:
            raise InvalidArgumentError(f"subproc_max_workers must be >= 1, got {subproc_max_workers}")
        if agent_timeout is not None and agent_timeout <= 0:
            raise InvalidArgumentError(f"agent_timeout must be positive or None, got {agent_timeout}")
        if mode == "subproc":
            dumps_by_value(agent, "agent")  # refuse now, not at the first episode
        self.mode = mode
        self.agent = agent
        self.proxy_addr = proxy_addr.rstrip("/").removesuffix("/v1")
        self.admin_api_key = admin_api_key
        self.discount = discount
        self.export_style = export_style
        self.discount_mode = discount_mode
        self.raw_calls = raw_calls
        self.subproc_max_workers = subproc_max_workers
        self.agent_timeout = agent_timeout
        # In-process episodes (inline mode only): `asgi_app` answers the agent's HTTP calls,
        # `proxy_state` (default: the app's own) takes the lifecycle calls. A sub-app mounted
        # under proxy_addr's path (the Session's /eval) is routed through the root app, so the
        # two can differ.
        self.asgi_app = asgi_app if mode == "inline" else None
        self.proxy_state = None
        if self.asgi_app is not None:
            self.proxy_state = proxy_state if proxy_state is not None else proxy_state_of(asgi_app)
        # Why episodes were rejected, by kind ("agent_error", "agent_timeout", "invalid_reward",
        # "no_interactions", "proxy_error", "subproc_crash", "agent_abandoned": an agent that ignored its
        # cancellation at agent_timeout for CANCEL_GRACE_S, left running); read by executors and dashboards.
        self.rejections: collections.Counter[str] = collections.Counter()
        self.accepted = 0
        self._last_reason: str | None = None
        # Reason per asyncio task, so a caller awaiting arun_episode reads its own episode's
        # reason even while other episodes are rejected concurrently.
        self._task_reasons: weakref.WeakKeyDictionary[asyncio.Task, str | None] = weakref.WeakKeyDictionary()
        self._workers = AgentProcessPool(subproc_max_workers)  # subproc mode's; no process until used
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    # ----------------------------------------------------------------- resources
    def _http_client(self) -> httpx.AsyncClient:
        """One client per event loop: httpx connections are bound to the loop that made them."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.is_closed:
            # The old client's loop is gone or different; its sockets die with it.
            if self.asgi_app is not None:
                self._http = asgi_http_client(self.asgi_app, self.proxy_addr)
            else:
                self._http = httpx.AsyncClient(
                    timeout=httpx.Timeout(600.0, connect=10.0),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=8),
                )
            self._http_loop = loop
        return self._http

    def close(self) -> None:
        """Shut the process pool, drop the shared HTTP client and close the agent (its `close()`,
        if it has one: e.g. the math agent's reward worker processes)."""
        close_agent = getattr(self.agent, "close", None)
        if callable(close_agent):
            try:
                close_agent()
            except Exception:  # closing must go on
                logger.warning("closing the agent %r failed", self.agent, exc_info=True)
        self._workers.close()
        http, self._http = self._http, None
        if http is not None and not http.is_closed:
            loop = self._http_loop
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not None and running is loop:
                running.create_task(http.aclose())
            elif loop is not None and not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(http.aclose())
            # Otherwise the loop is gone; its sockets were closed with it.
        self._http_loop = None

    async def aclose(self) -> None:
        """`close()` on the loop that ran the episodes: an agent's `async def aclose()` is awaited
        first (what it holds on this loop, e.g. MCP server connections, is closed here), then its
        `close()` runs as well."""
        if self._http is not None and self._http_loop is asyncio.get_running_loop():
            await self._http.aclose()
        self._http = None
        aclose_agent = getattr(self.agent, "aclose", None)
        if callable(aclose_agent):
            try:
                await aclose_agent()
            except Exception:  # closing must go on
                logger.warning("closing the agent %r failed", self.agent, exc_info=True)
        self.close()

    # ----------------------------------------------------------------- the episode
    async def _run_agent(self, session_api_key: str, data: dict[str, Any]) -> Any:
        if self.mode == "inline":
            coro = self.agent.run(
                data,
                base_url=f"{self.proxy_addr}/v1",
                api_key=session_api_key,
                http_client=self._http_client(),
            )
            try:
                return await run_within(coro, self.agent_timeout, what=f"agent {type(self.agent).__name__}")
            except TimeoutError as exc:
                raise EpisodeRejected(
                    "agent_timeout", f"agent did not finish within agent_timeout={self.agent_timeout}s"
                ) from exc
            except TaskAbandoned as exc:
                raise EpisodeRejected("agent_abandoned", str(exc)) from exc
        env = {
            "OPENAI_BASE_URL": f"{self.proxy_addr}/v1",
            "OPENAI_API_KEY": session_api_key,
            "ANTHROPIC_BASE_URL": self.proxy_addr,
            "ANTHROPIC_API_KEY": session_api_key,
        }
        return await self._workers.run(self.agent, data, env, self.agent_timeout)

    async def _assign_rewards(
        self,
        client: OpenAIProxyClient | InProcessProxyClient,
        reward: float | dict[str, float] | AgentRewards,
    ) -> None:
        if isinstance(reward, AgentRewards):
            for agent, value in reward.per_agent.items():
                await _assigned_or_rejected(client.set_agent_reward(agent, value), f"agent {agent!r}")
            return
        if isinstance(reward, dict):
            for interaction_id, value in reward.items():
                await _assigned_or_rejected(client.set_reward(interaction_id, value), repr(interaction_id))
            return
        await _assigned_or_rejected(client.set_last_reward(reward))

    @property
    def last_rejection_reason(self) -> str | None:
        """Why the current task's last episode was rejected (else the latest rejection anywhere)."""
        task = asyncio.current_task() if _loop_running() else None
        if task is not None and task in self._task_reasons:
            return self._task_reasons[task]
        return self._last_reason

    def _reject(self, task_id: str, kind: str, message: str) -> None:
        self.rejections[kind] += 1
        reason = f"{kind}: {message}"
        self._last_reason = reason
        task = asyncio.current_task()
        if task is not None:
            self._task_reasons[task] = reason
        logger.warning("episode %s rejected (%s): %s", task_id, kind, message)

    def _lifecycle_client(self, task_id: str) -> OpenAIProxyClient | InProcessProxyClient:
        if self.proxy_state is not None:
            return InProcessProxyClient(self.proxy_state, task_id)
        return OpenAIProxyClient(
            self.proxy_addr, self.admin_api_key, task_id, http_client=self._http_client()
        )

    async def _discard_session(self, client: OpenAIProxyClient | InProcessProxyClient) -> None:
        if client._session_id is None:
            return
        try:
            async with asyncio.timeout(10):
                if not client.session_ended:
                    await client.end_session(attempts=1)
                await self._export(client)
        except (ProxyRequestError, TimeoutError, asyncio.CancelledError) as exc:
            logger.error("could not free cancelled session %s: %r", client._session_id, exc)

    async def _export(
        self, client: OpenAIProxyClient | InProcessProxyClient
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """The episode's calls: as recorded (`raw_calls`, the Session's `RolloutBatch` discounts
        and styles them), or discounted and styled by the proxy (AReaL's export)."""
        if self.raw_calls:
            return await client.export_calls()
        return await client.export_interactions(self.discount, self.export_style, self.discount_mode)

    async def arun_episode(
        self, engine: InferenceEngine | None, data: dict[str, Any], task_id: str | None = None
    ) -> dict[str, Any] | None:
        """One episode; `engine` is unused (the proxy owns the engine), kept for the interface."""
        task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        current = asyncio.current_task()
        if current is not None:
            self._task_reasons[current] = None  # this task's episode has no rejection (yet)
        client = self._lifecycle_client(task_id)
        rejection: EpisodeRejected | None = None
        try:
            await client.grant_capacity()
            async with client:
                try:
                    # Agents mutate their input (messages.append ...); never share it.
                    result = await self._run_agent(client.session_api_key, copy.deepcopy(data))
                    await self._assign_rewards(client, parse_agent_rewards(result))
                except EpisodeRejected as exc:
                    rejection = exc
                except ProxyRequestError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the agent's own failure, whatever it is
                    rejection = EpisodeRejected("agent_error", f"agent raised {type(exc).__name__}: {exc}")
            # Export even a rejected episode: it is the step that frees the session on the proxy.
            interactions = await self._export(client)
        except asyncio.CancelledError:
            # The executor gave up on this episode (KeyboardInterrupt, shutdown): still free the
            # session on the proxy, best effort and bounded, then let the cancellation through.
            await self._discard_session(client)
            raise
        except ProxyRequestError as exc:
            self._reject(task_id, "proxy_error", str(exc))
            if client._session_id is not None and not client.session_ended:
                logger.error("session %s may be left on the proxy until its stale sweep", client._session_id)
            return None
        if rejection is not None:
            self._reject(task_id, rejection.kind, str(rejection))
            return None
        if not interactions:
            self._reject(task_id, "no_interactions", "the agent made no LLM call through the proxy")
            return None
        self.accepted += 1
        return interactions

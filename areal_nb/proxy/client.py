"""`OpenAIProxyClient`: the trainer side of one proxy session.

`async with OpenAIProxyClient(...) as client:` starts a session (admin key), hands out the
session key for the agent, and always ends the session on exit. After the block,
`export_interactions()` fetches the session's interactions with the admin key and the
explicit session id, so a re-mapped session key can never redirect the export.

Unlike AReaL's client (docs/reference/areal-semantics.md, "The trainer-side client and workflow")
start_session retries are bounded, and a 400 from
set_reward is an error, not a log line: a reward that does not land must not pass silently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Self

import httpx

from areal_nb.api import DiscountMode, ExportStyle
from areal_nb.errors import (  # noqa: F401 (re-exported)
    RETRYABLE_STATUS,
    CallOrderError,
    InvalidArgumentError,
    NotStartedError,
    ProxyRequestError,
)

if TYPE_CHECKING:
    from areal_nb.capture import InteractionWithTokenLogpReward

logger = logging.getLogger(__name__)


def _error_detail(response: httpx.Response) -> str:
    """The human-readable message of an OpenAI-style / FastAPI-style error body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How long the client waits for the proxy and how often it tries again.

    `start_session` is tried up to `start_attempts` times (the proxy may still be starting, or
    full), sleeping `retry_delay` seconds after the first failure and doubling up to
    `max_retry_delay`; a request waits `request_timeout` seconds, an export `export_timeout`.
    """

    start_attempts: int = 6
    retry_delay: float = 0.25
    max_retry_delay: float = 2.0
    request_timeout: float = 30.0
    export_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.start_attempts < 1:
            raise InvalidArgumentError(f"start_attempts must be >= 1, got {self.start_attempts}")


class OpenAIProxyClient:
    """One session on a running proxy.

    `base_url` is the proxy root (`http://127.0.0.1:PORT`, with or without a trailing `/v1`).
    `http_client` may be shared between clients; one created here is closed on exit.
    """

    def __init__(
        self,
        base_url: str,
        admin_api_key: str,
        task_id: str,
        http_client: httpx.AsyncClient | None = None,
        *,
        start_attempts: int = 6,
        retry_delay: float = 0.25,
        max_retry_delay: float = 2.0,
        request_timeout: float = 30.0,
        export_timeout: float = 120.0,
        session_api_key: str | None = None,
    ) -> None:
        if not admin_api_key:
            raise InvalidArgumentError("OpenAIProxyClient needs the proxy's admin_api_key")
        if not task_id:
            raise InvalidArgumentError("OpenAIProxyClient needs a non-empty task_id")
        root = base_url.rstrip("/")
        self.base_url = root.removesuffix("/v1")
        self.admin_api_key = admin_api_key
        self.task_id = task_id
        self._http = http_client
        self._owns_http = http_client is None
        self.retry = RetryPolicy(
            start_attempts, retry_delay, max_retry_delay, request_timeout, export_timeout
        )
        self._requested_key = session_api_key
        self._session_id: str | None = None
        self._session_api_key: str | None = None
        self.session_ended = False

    # ----------------------------------------------------------------- properties
    @property
    def session_id(self) -> str:
        if self._session_id is None:
            raise NotStartedError("no session: use `async with OpenAIProxyClient(...)` first")
        return self._session_id

    @property
    def session_api_key(self) -> str:
        if self._session_api_key is None:
            raise NotStartedError("no session: use `async with OpenAIProxyClient(...)` first")
        return self._session_api_key

    # ----------------------------------------------------------------- plumbing
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient()
            self._owns_http = True
        return self._http

    async def _post(
        self, endpoint: str, key: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """POST JSON with a bearer key; return the JSON body or raise ProxyRequestError."""
        url = f"{self.base_url}/{endpoint}"
        try:
            response = await self._client().post(
                url,
                json=body if body is not None else {},
                headers={"Authorization": f"Bearer {key}"},
                timeout=timeout if timeout is not None else self.retry.request_timeout,
            )
        except httpx.HTTPError as exc:  # connection refused, reset, timeout
            raise ProxyRequestError(endpoint, None, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProxyRequestError(endpoint, response.status_code, _error_detail(response))
        try:
            return response.json()
        except ValueError as exc:
            raise ProxyRequestError(endpoint, response.status_code, "response is not JSON") from exc

    async def _post_with_retries(
        self, endpoint: str, key: str, body: dict[str, Any] | None, attempts: int
    ) -> dict[str, Any]:
        delay = self.retry.retry_delay
        for attempt in range(1, attempts + 1):
            try:
                return await self._post(endpoint, key, body)
            except ProxyRequestError as exc:
                if not exc.retryable or attempt == attempts:
                    raise
                logger.warning("%s (attempt %d/%d), retrying in %.2fs", exc, attempt, attempts, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry.max_retry_delay)
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------- lifecycle
    async def grant_capacity(self) -> int:
        """Reserve one session slot on the proxy; returns the proxy's capacity count."""
        out = await self._post_with_retries("grant_capacity", self.admin_api_key, None, 3)
        return int(out["capacity"])

    async def start_session(self) -> str:
        if self._session_id is not None:
            raise CallOrderError(f"session {self._session_id} already started by this client")
        body: dict[str, Any] = {"task_id": self.task_id}
        if self._requested_key is not None:
            body["api_key"] = self._requested_key
        out = await self._post_with_retries(
            "rl/start_session", self.admin_api_key, body, self.retry.start_attempts
        )
        self._session_id = str(out["session_id"])
        self._session_api_key = str(out["api_key"])
        self.session_ended = False
        return self._session_id

    async def end_session(self, attempts: int = 3) -> None:
        await self._post_with_retries("rl/end_session", self.session_api_key, None, attempts)
        self.session_ended = True

    async def __aenter__(self) -> Self:
        try:
            await self.start_session()
        except BaseException:
            await self._close_own_http()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.end_session()
        except ProxyRequestError as end_exc:
            if exc is None:
                raise
            # Do not mask the error that ended the block; the proxy's stale sweep reclaims it.
            logger.error("end_session for %s failed after %r: %s", self._session_id, exc, end_exc)

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it (after export)."""
        await self._close_own_http()

    async def _close_own_http(self) -> None:
        if self._owns_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    # ----------------------------------------------------------------- rewards
    async def set_reward(self, interaction_id: str, reward: float) -> None:
        await self._post(
            "rl/set_reward", self.session_api_key, {"interaction_id": interaction_id, "reward": reward}
        )

    async def set_last_reward(self, reward: float) -> None:
        await self._post("rl/set_reward", self.session_api_key, {"reward": reward})

    async def set_agent_reward(self, agent: str, reward: float) -> None:
        """`agent`'s most recently completed call takes `reward`."""
        await self._post("rl/set_reward", self.session_api_key, {"agent": agent, "reward": reward})

    # ----------------------------------------------------------------- export
    async def export_interactions(
        self, discount: float = 1.0, style: ExportStyle = "individual", discount_mode: DiscountMode = "tree"
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """Fetch this session's interactions (one-shot on the proxy), parents linked again."""
        from areal_nb.capture import InteractionWithTokenLogpReward

        out = await self._post(
            "export_trajectories",
            self.admin_api_key,
            {
                "session_id": self.session_id,
                "discount": discount,
                "style": style,
                "discount_mode": discount_mode,
            },
            timeout=self.retry.export_timeout,
        )
        wire = out.get("interactions")
        if not isinstance(wire, dict):
            raise ProxyRequestError(
                "export_trajectories", 200, f"expected an 'interactions' object, got {type(wire)}"
            )
        rebuilt: dict[str, InteractionWithTokenLogpReward] = {}
        # The proxy sends parents before children, so each parent is rebuilt before it is needed.
        for interaction_id, item in wire.items():
            rebuilt[interaction_id] = InteractionWithTokenLogpReward.from_wire(item, rebuilt)
        return rebuilt

    async def export_calls(self) -> dict[str, InteractionWithTokenLogpReward]:
        """Every completed call with the rewards as the agent set them (one-shot on the proxy).

        The training path: the `RolloutBatch` discounts and styles them. `/export_trajectories`
        discounts for its external consumers and sends each call's own reward as `raw_reward`
        (unset: 0.0); that value is put back as the call's reward.
        """
        calls = await self.export_interactions(discount=1.0, style="individual", discount_mode="tree")
        for call in calls.values():
            call.reward = call.raw_reward
        return calls

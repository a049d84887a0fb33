"""The proxy without sockets, for agents that run in the proxy's own process.

Two pieces, both over the same FastAPI app and `ProxyState` that uvicorn serves to external
agents:

- `InProcessProxyClient`: the session lifecycle (grant capacity, start, reward, end, export)
  as direct calls on the app's `ProxyState` — same interface and errors as
  `OpenAIProxyClient`, no HTTP, no JSON round trip of the exported tensors;
- `asgi_http_client(app)`: an `httpx.AsyncClient` whose transport calls the app in-process,
  handed to inline agents as their `http_client`, so the OpenAI / Anthropic SDK request still
  goes through the app's routes, auth and validation — only the socket, the HTTP parser and the
  second thread hop are gone. Chat and text completions, the calls agents make, take the app's
  direct lane (`app.state.direct_routes`, built by `create_app`: same checks and handler
  without the ASGI middleware, routing and dependency solving); everything else, and any
  request the lane hands back, goes through `httpx.ASGITransport`.

Why this is safe next to uvicorn: the ASGI transport runs the app on the *calling* loop (the
Session's loop) while uvicorn runs it on its own thread and loop. `ProxyState` guards its maps
with a `threading.Lock` and signals session ends with a `threading.Event`; the engine's
`agenerate` resolves a future on whichever loop awaited it. Nothing the app holds is bound to
one loop. A session is driven by one agent at a time, so its `InteractionCache` is not shared
between loops in practice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

import httpx

from areal_nb.api import DiscountMode, ExportStyle
from areal_nb.errors import ArgumentTypeError, CallOrderError, InvalidArgumentError, NotStartedError

from .client import ProxyRequestError
from .errors import HTTPError, ProxyError
from .export import discounted_calls, session_calls
from .state import ProxyState, SessionData

if TYPE_CHECKING:
    from areal_nb.capture import InteractionWithTokenLogpReward


def asgi_http_client(app: Any, base_url: str, timeout: float = 600.0) -> httpx.AsyncClient:
    """An httpx client that serves requests from `app` on the calling event loop, no socket."""
    return InProcessClient(transport=InProcessTransport(app), base_url=base_url, timeout=timeout)


class SetCookieOnlyCookies(httpx.Cookies):
    """`httpx.Cookies` that skips the cookie jar for responses without a Set-Cookie header.

    httpx hands every response to `http.cookiejar` through urllib request/response wrappers,
    which it builds first (a tenth of what httpx costs an in-process call); the jar reads only
    Set-Cookie and Set-Cookie2, so a response without them changes nothing and is skipped.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class InProcessClient(httpx.AsyncClient):
    """The `httpx.AsyncClient` inline agents get; its cookies are `SetCookieOnlyCookies`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cookies = self._cookies  # through the setter below

    @property
    def cookies(self) -> httpx.Cookies:
        return self._cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._cookies = SetCookieOnlyCookies(cookies)


class InProcessTransport(httpx.AsyncBaseTransport):
    """Calls `app` on the calling event loop: POSTs to a direct route of the app (or of an app
    mounted in it) go straight to it, the rest — and what it declines — through ASGI.

    `raise_app_exceptions=False`: an exception inside the app becomes the same 500 response a
    real server sends, not an exception raised into the agent.
    """

    def __init__(self, app: Any) -> None:
        self._asgi = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._direct = direct_routes(app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        route = self._direct.get(request.url.path) if request.method == "POST" else None
        if route is not None:
            raw = await request.aread()  # kept on the request: the ASGI path can read it again
            response = await route(request.url.path, raw, request.headers)
            if response is not None:
                return httpx.Response(
                    response.status_code, headers=response.raw_headers, content=response.body, request=request
                )
        return await self._asgi.handle_async_request(request)

    async def aclose(self) -> None:
        await self._asgi.aclose()


def direct_routes(app: Any, prefix: str = "") -> dict[str, Any]:
    """{path: route} of `app.state.direct_routes`, and of the apps mounted in `app` under their
    mount path (the Session's greedy twin at /eval)."""
    from starlette.routing import Mount

    state = getattr(app, "state", None)
    routes = {prefix + path: route for path, route in (getattr(state, "direct_routes", None) or {}).items()}
    for mounted in getattr(app, "routes", ()):
        if isinstance(mounted, Mount):
            routes.update(direct_routes(mounted.app, prefix + mounted.path))
    return routes


def proxy_state_of(app: Any) -> ProxyState:
    state = getattr(getattr(app, "state", None), "proxy", None)
    if not isinstance(state, ProxyState):
        raise ArgumentTypeError(
            f"{type(app).__name__} is not a proxy app from areal_nb.proxy.create_app (no app.state.proxy)"
        )
    return state


class InProcessProxyClient:
    """One session on a proxy app's state in this process: `OpenAIProxyClient`'s API as direct calls.

    Errors are `ProxyRequestError` with the status the HTTP endpoint would answer, so callers
    handle both clients alike.
    """

    def __init__(self, state: ProxyState, task_id: str) -> None:
        if not isinstance(state, ProxyState):
            raise ArgumentTypeError(
                f"InProcessProxyClient needs a ProxyState (app.state.proxy), got {type(state).__name__}"
            )
        if not task_id:
            raise InvalidArgumentError("InProcessProxyClient needs a non-empty task_id")
        self.state = state
        self.task_id = task_id
        self._session: SessionData | None = None
        self.session_ended = False

    # ----------------------------------------------------------------- properties
    @property
    def _session_id(self) -> str | None:  # read by OpenAIProxyWorkflow like OpenAIProxyClient's
        return self._session.session_id if self._session is not None else None

    @property
    def session_id(self) -> str:
        return self._started().session_id

    @property
    def session_api_key(self) -> str:
        return self._started().api_key

    def _started(self) -> SessionData:
        if self._session is None:
            raise NotStartedError("no session: use `async with InProcessProxyClient(...)` first")
        return self._session

    # ----------------------------------------------------------------- lifecycle
    async def grant_capacity(self) -> int:
        return self.state.grant_capacity(1)

    async def start_session(self) -> str:
        if self._session is not None:
            raise CallOrderError(f"session {self._session.session_id} already started by this client")
        with _as_request_error("rl/start_session"):
            session = self.state.start_session(self.task_id)
        self._session = session
        self.session_ended = False
        return session.session_id

    async def end_session(self, attempts: int = 1) -> None:
        with _as_request_error("rl/end_session"):
            self.state.end_session(self._started())
        self.session_ended = True

    async def __aenter__(self) -> Self:
        await self.start_session()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.end_session()
        except ProxyRequestError:
            if exc is None:
                raise  # otherwise keep the error that ended the block; the stale sweep reclaims it

    async def aclose(self) -> None:
        """Nothing to close; kept for `OpenAIProxyClient` parity."""

    # ----------------------------------------------------------------- rewards
    async def set_reward(self, interaction_id: str, reward: float) -> None:
        cache = self._live_cache("rl/set_reward")
        try:
            cache.set_reward(interaction_id, reward)
        except KeyError:
            raise ProxyRequestError(
                "rl/set_reward",
                400,
                f"interaction {interaction_id!r} not found in session {self.session_id!r}",
            ) from None

    async def set_last_reward(self, reward: float) -> None:
        self._live_cache("rl/set_reward")
        with _as_request_error("rl/set_reward"):
            self._started().set_last_reward(reward)

    async def set_agent_reward(self, agent: str, reward: float) -> None:
        self._live_cache("rl/set_reward")
        with _as_request_error("rl/set_reward"):
            self._started().set_agent_reward(agent, reward)

    def _live_cache(self, endpoint: str) -> Any:
        """The session's cache, or the 410 the HTTP endpoint answers once the session is gone."""
        session = self._started()
        with _as_request_error(endpoint):
            self.state.session_for_key(session.api_key)
        return session.cache

    # ----------------------------------------------------------------- export
    async def export_interactions(
        self, discount: float = 1.0, style: ExportStyle = "individual", discount_mode: DiscountMode = "tree"
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """The session's interactions with discounted rewards; removes the session (one-shot).

        Same result as `/export_trajectories` (`proxy/export.py`), minus the wait (this client
        ended the session) and minus the JSON round trip: the interaction objects as they are.
        """
        return self._export(lambda session: discounted_calls(session, discount, style, discount_mode))

    async def export_calls(self) -> dict[str, InteractionWithTokenLogpReward]:
        """Every completed call with the rewards as the agent set them; removes the session
        (one-shot). The training path: the `RolloutBatch` discounts and styles them."""
        return self._export(session_calls)

    def _export(
        self, calls: Callable[[SessionData], dict[str, InteractionWithTokenLogpReward]]
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """Claim the ended session, take its `calls`, remove it; a failure leaves it exportable."""
        endpoint = "export_trajectories"
        session = self._started()
        if not session.ended:
            raise ProxyRequestError(
                endpoint, 504, f"session {session.session_id!r} has not ended: call end_session first"
            )
        with _as_request_error(endpoint):
            session = self.state.get_session(session.session_id)
            if self.state.claim_export(session) is False:  # a concurrent export holds it
                raise ProxyError(
                    409, f"session {session.session_id!r} is being exported", "export_in_progress"
                )
        try:
            interactions = calls(session)
        except (ValueError, RuntimeError) as exc:
            session.cache.undo_reward_discount()
            self.state.release_export(session)
            raise ProxyRequestError(
                endpoint, 400, f"cannot export session {session.session_id!r}: {exc}"
            ) from exc
        except BaseException:
            session.cache.undo_reward_discount()
            self.state.release_export(session)
            raise
        self.state.remove_session(session, "was exported")
        return interactions


class _as_request_error:
    """`with _as_request_error(endpoint):` turns an HTTP error (a ProxyError from the state, or any
    other `HTTPError`) into the client's ProxyRequestError, as the HTTP client would see it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # returns None: any other exception propagates unchanged
        if isinstance(exc, HTTPError):
            raise ProxyRequestError(self.endpoint, exc.status, exc.message) from exc

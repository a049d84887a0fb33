"""Per-app proxy state: sessions, their keys, capacity. No module globals: one object per app.

All mutations happen under one `threading.Lock` and never await while holding it, so the
state is safe both from the app's event loop and from a notebook thread.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from areal_nb.serving.auth import keys_equal

from .errors import ProxyError
from .settings import ProxySettings

# How many keys of exported/expired sessions are remembered, to answer 410 instead of 401.
_RETIRED_KEYS_KEPT = 10_000
# A key travels in an HTTP header and is stripped there: visible ASCII, inner spaces allowed.
# Anything else (edge spaces, control characters, non-ASCII) could never authenticate.
_HEADER_SAFE_KEY = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


@dataclass
class SessionData:
    """One agent episode: its interaction cache and lifecycle."""

    session_id: str
    api_key: str
    cache: Any  # areal_nb.capture.InteractionCache
    started_at: float = field(default_factory=time.monotonic)
    last_access: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    # tool-call id → exact argument string, so echoed Anthropic tool_use blocks match
    tool_arguments: dict[str, str] = field(default_factory=dict)
    exporting: bool = False
    removed_reason: str | None = None
    _finished: threading.Event = field(default_factory=threading.Event)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def touch(self) -> None:
        self.last_access = time.monotonic()

    def set_last_reward(self, reward: float) -> None:
        """Reward the most recently completed call; a 400 when there is none (yet)."""
        if self.cache.last_interaction_id is None:
            pending = len(self.cache)
            if not pending:
                raise ProxyError(
                    400, f"no interactions in session {self.session_id!r} to reward", "no_interactions"
                )
            raise ProxyError(
                400,
                f"no completed interactions in session {self.session_id!r} to reward: "
                f"{pending} call{' is' if pending == 1 else 's are'} still generating "
                "(set the reward once it returns, or by interaction_id)",
                "no_interactions",
            )
        self.cache.set_last_reward(reward)

    def set_agent_reward(self, agent: str, reward: float) -> None:
        """Reward `agent`'s most recently completed call; a 400 when it has none."""
        key = self.cache.last_interaction_id_of(agent)
        if key is None:
            agents = sorted({str(i.agent) for i in self.cache.values()})
            raise ProxyError(
                400,
                f"agent {agent!r} has no completed call in session {self.session_id!r} to reward "
                f"(the calls' agents: {', '.join(agents) or 'none'})",
                "no_interactions",
            )
        self.cache.set_reward(key, reward)

    def is_stale(self, timeout: float, now: float) -> bool:
        return now - self.last_access > timeout

    async def wait_ended(self, timeout: float, gave_up: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """True once the session ended (or was swept); False after `timeout` seconds or as
        soon as `gave_up()` (checked every 0.25 s, e.g. "the client disconnected") is true."""
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + 0.25
        # Poll a threading.Event: end_session may come from any loop or thread.
        while not self._finished.is_set():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return False
            if gave_up is not None and now >= next_check:
                if await gave_up():
                    return False
                next_check = now + 0.25
            await asyncio.sleep(min(0.02, left))
        return True


class ProxyState:
    """Sessions, key maps and capacity of one proxy app."""

    def __init__(self, settings: ProxySettings, cache_factory: Any) -> None:
        self.settings = settings
        self._cache_factory = cache_factory
        self._lock = threading.Lock()
        self.capacity = 0
        self.sessions: dict[str, SessionData] = {}
        self._key_to_session: dict[str, str] = {}
        self._retired_keys: OrderedDict[str, str] = OrderedDict()  # key → why it is gone
        self._next_index: dict[str, int] = {}
        self._last_sweep = time.monotonic()

    # ------------------------------------------------------------------ auth
    def check_admin(self, token: str | None) -> None:
        if token is None:
            raise ProxyError(
                401, "missing API key: send 'Authorization: Bearer <admin key>'", "missing_api_key"
            )
        if not keys_equal(token, self.settings.admin_api_key):
            raise ProxyError(403, "invalid admin API key", "invalid_admin_key")

    def session_for_key(self, token: str | None) -> SessionData:
        """The session a session key belongs to; 401 for missing/unknown keys, 410 if gone."""
        if token is None:
            raise ProxyError(
                401,
                "missing API key: send the session key as 'Authorization: Bearer <key>' or 'x-api-key'",
                "missing_api_key",
            )
        if keys_equal(token, self.settings.admin_api_key):
            raise ProxyError(
                401,
                "the admin key is not a session key: use the key from /rl/start_session",
                "invalid_api_key",
            )
        with self._lock:
            session_id = self._key_to_session.get(token)
            session = self.sessions.get(session_id) if session_id is not None else None
            if session is None:
                gone = self._retired_keys.get(token)
                if gone is not None:
                    raise ProxyError(410, gone, "session_gone")
                raise ProxyError(401, "invalid or expired session API key", "invalid_api_key")
            session.touch()
            return session

    # ------------------------------------------------------------------ lifecycle
    def grant_capacity(self, count: int = 1) -> int:
        with self._lock:
            self.capacity += count
            return self.capacity

    def start_session(self, task_id: str, api_key: str | None = None) -> SessionData:
        if api_key is not None and not _HEADER_SAFE_KEY.fullmatch(api_key):
            raise ProxyError(
                400,
                "api_key must be visible ASCII characters (spaces only between them): a key with "
                "leading/trailing whitespace, control or non-ASCII characters can never be sent back "
                "in an Authorization header",
                "invalid_api_key",
            )
        with self._lock:
            self._sweep_locked(force=False)
            if self.capacity <= 0:
                raise ProxyError(
                    429,
                    "no available capacity to start a new session: call /grant_capacity first",
                    "no_capacity",
                    retry_after=1,  # a slot frees when a session ends or capacity is granted
                )
            if api_key is not None:
                self._check_requested_key_locked(api_key)
            else:
                api_key = self._new_key_locked()
            index = self._next_index.get(task_id, 0)
            self._next_index[task_id] = index + 1
            session_id = f"{task_id}-{index}"
            session = SessionData(session_id=session_id, api_key=api_key, cache=self._cache_factory())
            self.capacity -= 1
            self.sessions[session_id] = session
            self._key_to_session[api_key] = session_id
            self._retired_keys.pop(api_key, None)
            return session

    def _check_requested_key_locked(self, api_key: str) -> None:
        if keys_equal(api_key, self.settings.admin_api_key):
            raise ProxyError(400, "api_key must not equal the admin key", "invalid_api_key")
        bound = self._key_to_session.get(api_key)
        if bound is None:
            return
        session = self.sessions.get(bound)
        if session is not None and not session.ended:
            raise ProxyError(409, f"API key is already bound to active session {bound!r}", "key_in_use")
        # Bound to an ended session: re-map; the old session stays exportable by its id.
        del self._key_to_session[api_key]

    def _new_key_locked(self) -> str:
        while True:
            key = secrets.token_urlsafe(32)
            if key not in self._key_to_session and key != self.settings.admin_api_key:
                return key

    def end_session(self, session: SessionData) -> int:
        with self._lock:
            if self.sessions.get(session.session_id) is not session:
                raise ProxyError(410, f"session {session.session_id!r} is gone", "session_gone")
            if session.ended_at is None:
                session.ended_at = time.monotonic()
            session._finished.set()
            return len(session.cache)

    def get_session(self, session_id: str) -> SessionData:
        with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise ProxyError(
                    404,
                    f"unknown session_id {session_id!r} (never started, already exported, or expired)",
                    "unknown_session",
                )
            return session

    def claim_export(self, session: SessionData) -> bool:
        """Mark a session as being exported (exports are one-shot); False while another export
        holds it (it either hands the session over or gives it back: ask again)."""
        with self._lock:
            if self.sessions.get(session.session_id) is not session:
                if session.removed_reason == "was exported":
                    raise ProxyError(
                        404, f"session {session.session_id!r} was already exported", "unknown_session"
                    )
                raise ProxyError(
                    410, f"session {session.session_id!r} {session.removed_reason}", "session_gone"
                )
            if session.exporting:
                return False
            session.exporting = True
            return True

    def release_export(self, session: SessionData) -> None:
        with self._lock:
            session.exporting = False

    def remove_session(self, session: SessionData, reason: str) -> bool:
        """Drop a session and its key; False if it was already removed (export raced)."""
        with self._lock:
            return self._remove_locked(session, reason)

    def _remove_locked(self, session: SessionData, reason: str) -> bool:
        if self.sessions.get(session.session_id) is not session:
            return False
        del self.sessions[session.session_id]
        session.removed_reason = reason
        if self._key_to_session.get(session.api_key) == session.session_id:
            del self._key_to_session[session.api_key]
            self._retired_keys[session.api_key] = f"session {session.session_id!r} {reason}"
            while len(self._retired_keys) > _RETIRED_KEYS_KEPT:
                self._retired_keys.popitem(last=False)
        session._finished.set()  # wake exports waiting on it
        return True

    def live_caches(self) -> dict[str, Any]:
        """The InteractionCache of every session not yet exported or expired, by session id."""
        with self._lock:
            return {session_id: session.cache for session_id, session in self.sessions.items()}

    def sweep(self) -> int:
        with self._lock:
            return self._sweep_locked(force=True)

    def _sweep_locked(self, force: bool) -> int:
        now = time.monotonic()
        if not force and now - self._last_sweep < self.settings.sweep_interval:
            return 0
        self._last_sweep = now
        stale = [s for s in self.sessions.values() if s.is_stale(self.settings.session_timeout, now)]
        for session in stale:
            self._remove_locked(session, f"expired after {self.settings.session_timeout:g} s without calls")
        for key in [k for k, sid in self._key_to_session.items() if sid not in self.sessions]:
            del self._key_to_session[key]
        return len(stale)

"""`ProxyServer`: serve a proxy app with uvicorn inside the current process.

Two ways to run it:
- `start()` — a daemon thread with its own asyncio loop (the notebook default);
- `start(loop=...)` / `await astart()` — as a task on an event loop the caller already runs
  (the Session's background loop), so the server shares that loop with the rollout code.

The listening socket is bound here, before uvicorn starts, so port 0 resolves to a real port
immediately and `url` is known without races. `stop()` is idempotent and closes the socket,
so re-running a notebook cell leaks neither threads nor ports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from typing import Any

import uvicorn

from areal_nb.errors import CallOrderError, ProxyStartError

from .settings import validate_admin_key


class ProxyServer:
    """uvicorn serving `app` on `host:port` (port 0 → a free port) in this process."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning"
    ) -> None:
        state = getattr(getattr(app, "state", None), "proxy", None)
        if state is not None:
            validate_admin_key(state.settings.admin_api_key, host)
        self.app = app
        self.host = host
        self.requested_port = port
        self.log_level = log_level
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._future: concurrent.futures.Future | asyncio.Future | None = None
        self._error: BaseException | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ info
    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        if self.port is None:
            raise CallOrderError("ProxyServer is not running: call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "stopped"
        return f"ProxyServer({where})"

    # ------------------------------------------------------------------ start
    def _prepare(self) -> uvicorn.Server:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (with proto 0
        # it does not, and Nagle + delayed ACK add ~40 ms to every response)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno, f"cannot bind proxy to {self.host}:{self.requested_port}: {exc.strerror}"
            ) from exc
        sock.set_inheritable(True)
        config = uvicorn.Config(
            self.app,
            log_level=self.log_level,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=300,  # agents pause between calls while tools run
            timeout_graceful_shutdown=5,
        )
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._error = None
        return uvicorn.Server(config)

    async def _serve(self, server: uvicorn.Server) -> None:
        try:
            assert self._socket is not None, "_prepare binds the socket before serving"
            await server.serve(sockets=[self._socket])
        except BaseException as exc:  # surfaced by _wait_started / stop
            self._error = exc
            raise

    def _wait_started(self, server: uvicorn.Server, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not server.started:
            done = (self._thread is not None and not self._thread.is_alive()) or (
                self._future is not None and self._future.done()
            )
            if done or self._error is not None:
                self._cleanup()
                raise ProxyStartError(f"proxy server failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"proxy server did not start within {timeout} s")
            time.sleep(0.005)

    def start(self, loop: asyncio.AbstractEventLoop | None = None, timeout: float = 30.0) -> ProxyServer:
        """Start serving and return once the server accepts connections (a no-op if running).

        With `loop`, the server runs as a task on that (running) loop; do not call this
        from the loop's own thread — use `await astart()` there.
        """
        with self._lock:
            if self._server is not None:
                return self
            server = self._prepare()
            self._server = server
            if loop is None:
                self._thread = threading.Thread(
                    target=lambda: asyncio.run(self._serve(server)),
                    name=f"areal-proxy-{self.port}",
                    daemon=True,
                )
                self._thread.start()
            else:
                self._future = asyncio.run_coroutine_threadsafe(self._serve(server), loop)
            self._wait_started(server, timeout)
        return self

    async def astart(self, timeout: float = 30.0) -> ProxyServer:
        """Start serving as a task on the running loop (a no-op if running)."""
        if self._server is not None:
            return self
        server = self._prepare()
        self._server = server
        self._future = asyncio.ensure_future(self._serve(server))
        deadline = time.monotonic() + timeout
        while not server.started:
            if self._future.done():
                self._cleanup()
                raise ProxyStartError(f"proxy server failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                await self.astop()
                raise TimeoutError(f"proxy server did not start within {timeout} s")
            await asyncio.sleep(0.005)
        return self

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving, wait for the server to finish, release the port. Idempotent."""
        server, thread, future = self._server, self._thread, self._future
        if server is None:
            return
        server.should_exit = True
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                server.force_exit = True
                thread.join(timeout)
        elif isinstance(future, concurrent.futures.Future):
            try:
                future.result(timeout)
            except concurrent.futures.TimeoutError:
                server.force_exit = True
                future.cancel()
            except BaseException:
                pass  # already reported by start, or a cancelled loop
        elif future is not None and not future.done():
            raise CallOrderError("this server runs on the calling loop: use `await server.astop()`")
        self._cleanup()

    async def astop(self, timeout: float = 10.0) -> None:
        """Stop a server started with `astart()` (or on this loop). Idempotent."""
        server, future = self._server, self._future
        if server is None:
            return
        server.should_exit = True
        if isinstance(future, asyncio.Future):
            try:
                await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:
                server.force_exit = True
                future.cancel()
            except BaseException:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket = None
        self._server = None
        self._thread = None
        self._future = None
        self.port = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ProxyServer:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

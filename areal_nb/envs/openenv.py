"""OpenEnv environments as agents: `reset` / `step` over the server's WebSocket, the model's replies
as the actions, the environment's rewards as the episode's rewards.

An OpenEnv environment is an HTTP server (`openenv.core.env_server.create_app`). Its `/reset`
and `/step` routes are stateless (each builds a fresh environment), so an episode holds one
WebSocket session at `/ws`, as OpenEnv's own `EnvClient` does: `{"type": "reset", "data": {...}}`
and `{"type": "step", "data": <action>}` each answer `{"type": "observation", "data":
{"observation": {...}, "reward": r, "done": d}}` or `{"type": "error", "data": {"message": ...}}`.
The reset data is the task row itself: the server passes on the keys its `reset()` accepts
(`seed`, `episode_id`, or the environment's own).

    agent = OpenEnvAgent(OpenEnvServer("my_env.server:app"))   # started on loopback, stopped on close
    agent = OpenEnvAgent("http://127.0.0.1:8000")               # a server already running
    Session(dataset=[{"seed": i} for i in range(100)], agent__workflow=agent)

Each reply's step reward goes to the completion that produced it (the proxy then propagates it
back through the earlier turns with `agent.turn_discount`). A server that cannot be reached,
closes the session or answers an error raises `EnvironmentServerError`: the episode is rejected
with that message and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Self

import httpx

from areal_nb.agents.sdk_agent import SDKAgent, echo, openai_client
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError
from areal_nb.serving.health import answers_health

from .errors import EnvironmentServerError

Observation = dict[str, Any]


def message_action(reply: str) -> dict[str, Any]:
    """The default action: the reply as `{"message": reply}` (the field of OpenEnv's text template)."""
    return {"message": reply}


def observation_text(observation: Mapping[str, Any]) -> str:
    """The default user message for an observation: its only text field, else all of it as JSON."""
    texts = [v for v in observation.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(dict(observation), sort_keys=True, default=str)


def _jsonable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as reset data: the keys whose values JSON can carry (the server keeps those its
    `reset()` accepts)."""
    out = {}
    for key, value in row.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[str(key)] = value
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OpenEnvServer:
    """An OpenEnv server run by this process: `uvicorn <app>` on loopback in a child process.

    `app` is the ASGI app's import path (`"package.module:app"`, as uvicorn takes it); `cwd` and
    `env` are the child's (its `PYTHONPATH` must reach the module). Started by the first episode
    (or `start()`), stopped by `close()` — the Session closes its agent, and the agent this server.
    """

    def __init__(
        self,
        app: str,
        *,
        cwd: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        if ":" not in app:
            raise InvalidArgumentError(f"app must be an import path 'package.module:app', got {app!r}")
        self.app = app
        self.cwd = None if cwd is None else str(cwd)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        """Start the server if it is not running; its base URL once `/health` answers."""
        with self._lock:
            if self.process is not None and self.process.poll() is None and self.url is not None:
                return self.url
            port = _free_port()
            env = {**os.environ, **self.env}
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    self.app,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                cwd=self.cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            self.url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + self.startup_timeout
            while True:
                if self.process.poll() is not None:
                    err = (
                        self.process.stderr.read().decode(errors="replace")[-2000:]
                        if self.process.stderr
                        else ""
                    )
                    raise EnvironmentServerError(
                        f"the OpenEnv server {self.app!r} exited with code {self.process.returncode} while "
                        f"starting:\n{err}"
                    )
                if answers_health(partial(httpx.get, timeout=2.0), self.url):
                    return self.url
                if time.monotonic() > deadline:
                    self._stop()
                    raise EnvironmentServerError(
                        f"the OpenEnv server {self.app!r} did not answer /health within {self.startup_timeout}s"
                    )
                time.sleep(0.1)

    def running_url(self) -> str:
        """The URL of the running server; EnvironmentServerError if it was never started or has exited."""
        if self.process is None or self.url is None:
            raise EnvironmentServerError(f"the OpenEnv server {self.app!r} is not started; call start()")
        code = self.process.poll()
        if code is not None:
            raise EnvironmentServerError(
                f"the OpenEnv server {self.app!r} at {self.url} is not running (its process exited with "
                f"code {code}); call start() to start it again"
            )
        return self.url

    def _stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OpenEnvAgent(SDKAgent):
    """Plays one OpenEnv episode per task row: reset with the row, then reply → step until `done`
    or `max_turns`. Returns each reply's step reward by completion id.

    `server`: an `OpenEnvServer` (started here, stopped by `close()`) or the URL of a running one.
    `action_fn(reply) -> dict`: the action the environment's schema takes (default
    `{"message": reply}`). `observation_fn(observation) -> str`: the next user message (default:
    the observation's only text field, else its JSON). `message_timeout`: seconds one reset or step
    may take before the episode is rejected.
    """

    def __init__(
        self,
        server: OpenEnvServer | str,
        *,
        action_fn: Callable[[str], dict[str, Any]] = message_action,
        observation_fn: Callable[[Observation], str] = observation_text,
        system_prompt: str | None = None,
        max_turns: int = 8,
        message_timeout: float = 60.0,
        model: str = "default",
        temperature: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> None:
        super().__init__(max_turns, model, temperature, max_completion_tokens)
        if not isinstance(server, (OpenEnvServer, str)):
            raise ArgumentTypeError(f"server must be an OpenEnvServer or a URL, got {type(server).__name__}")
        self.server = server
        self.action_fn = action_fn
        self.observation_fn = observation_fn
        self.system_prompt = system_prompt
        self.message_timeout = message_timeout

    async def _ws_url(self) -> str:
        if isinstance(self.server, OpenEnvServer):
            if self.server.process is None:  # the first episode starts it (off the event loop: it waits)
                await asyncio.to_thread(self.server.start)
            base = self.server.running_url()
        else:
            base = self.server
        base = base.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return base + "/ws"

    async def _call(self, ws: Any, url: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message, return the observation result `{"observation", "reward", "done"}`."""
        from websockets.exceptions import WebSocketException

        try:
            await ws.send(json.dumps(message))
            raw = await asyncio.wait_for(ws.recv(), self.message_timeout)
        except TimeoutError as exc:
            raise EnvironmentServerError(
                f"the OpenEnv server at {url} did not answer {message['type']!r} within {self.message_timeout}s"
            ) from exc
        except (WebSocketException, OSError) as exc:
            raise EnvironmentServerError(
                f"the OpenEnv server at {url} dropped the session during {message['type']!r}: {exc}"
            ) from exc
        try:
            reply = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EnvironmentServerError(
                f"the OpenEnv server at {url} answered non-JSON: {raw!r:.300}"
            ) from exc
        if (
            not isinstance(reply, dict)
            or reply.get("type") != "observation"
            or not isinstance(reply.get("data"), dict)
        ):
            raise EnvironmentServerError(
                f"the OpenEnv server at {url} refused {message['type']!r}: {json.dumps(reply, default=str)[:600]}"
            )
        return reply["data"]

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        url = await self._ws_url()
        try:
            ws = await asyncio.wait_for(connect(url, max_size=None), self.message_timeout)
        except (OSError, TimeoutError) as exc:
            raise EnvironmentServerError(f"cannot reach the OpenEnv server at {url}: {exc!r}") from exc
        except Exception as exc:  # websockets' handshake errors (InvalidStatus, InvalidURI, ...)
            raise EnvironmentServerError(
                f"cannot open a session with the OpenEnv server at {url}: {exc}"
            ) from exc
        client = openai_client(**extra_kwargs)
        rewards: dict[str, float] = {}
        async with ws:
            result = await self._call(ws, url, {"type": "reset", "data": _jsonable_row(data)})
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            messages.append({"role": "user", "content": self.observation_fn(result.get("observation") or {})})
            for _ in range(self.max_turns):
                completion = await self.chat(client, messages)
                message = completion.choices[0].message
                result = await self._call(
                    ws, url, {"type": "step", "data": self.action_fn(message.content or "")}
                )
                reward = result.get("reward")
                rewards[completion.id] = 0.0 if reward is None else float(reward)
                if result.get("done"):
                    break
                messages = messages + [
                    echo(message),
                    {"role": "user", "content": self.observation_fn(result.get("observation") or {})},
                ]
            with contextlib.suppress(
                WebSocketException, OSError
            ):  # the session ends with the connection anyway
                await ws.send(json.dumps({"type": "close"}))
        return rewards

    def close(self) -> None:
        """Stop the server this agent started (a URL's server is not ours to stop)."""
        if isinstance(self.server, OpenEnvServer):
            self.server.close()

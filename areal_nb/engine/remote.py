"""`SGLangEngine`: an `InferenceEngine` that generates on SGLang servers (or `areal-nb engine-server`).

Token in, token out through SGLang's native API (`docs/reference/sglang-api.md`): `POST /generate` with
`input_ids`, the closed `sampling_params` key set and `return_logprob`; tokens and log-probs come from
`meta_info.output_token_logprobs`, the stop reason from `finish_reason.type`, one version per token
from `meta_info.weight_versions` spans (0.5.20+) or else the single `meta_info.weight_version`.

Threads. The engine owns one event loop in a daemon thread and one aiohttp connection pool on it
(control calls go through an `httpx.AsyncClient` over it, `/generate` straight to it); every
HTTP call runs there. `agenerate` may be awaited from any loop in any thread (like `LocalEngine`),
and the sync control methods (`pause`, `resume`, `update_weights`, `set_version`, `close`) may be
called from any thread but the engine's own. Requests submitted from another thread before the
loop wakes up start together (`_submit`): one wake-up for a rollout's burst, which then leaves
back to back instead of interleaved with GIL hand-overs between the two threads.

Several servers. A request whose prompt extends the exact tokens (prompt + output) of a request this
engine finished earlier goes to the server that produced them, so the server's prefix cache holds the
conversation so far; any other request (a new conversation, or a turn whose prompt was re-rendered)
goes to the live server with the fewest requests in flight. The table of finished sequences is an
LRU of `max_tracked_sequences` entries keyed by (length, hash of the tokens).

Failure. Connecting times out after `connect_timeout` s. A transport error on a request (the server
process died, the connection was reset) marks that server down: the request fails with
`ServerDownError` naming the server and the cause, every later request goes to the other servers, and
a down server never comes back by itself (a restarted server could serve other weights). With no live
server left, `agenerate` fails at once. A 400 from the server is an `EngineRefused` (an
`InvalidRequestError`, so a `ValueError`) with its message: the proxy answers the agent 400 too.

Pause and weight updates. `pause()` sends `/pause_generation` in `abort` mode: in-flight requests come
back with partial output and are re-sent, after `resume()`, with the partial output appended to the
prompt and the remaining token budget (AReaL's interruption loop), so a caller sees one response whose
per-token versions show both weight versions. `update_weights(weights, version)` writes the weights
under `weights_dir` (atomic rename, `weight_sync.write_weights`) unless given a directory, then
pause → `/update_weights_from_disk` with `weight_version` → continue on every live server; a server
that refuses the folder is asked again with backoff for `weights_wait` s (a folder written on another
node may not be visible yet), then the update fails naming the path.
An explicit `abort(rid)` returns the partial output with stop reason "abort".

LoRA (`lora=True`: servers started with `--enable-lora`, `serves_lora_adapters`). `update_weights`
given a `LoraAdapter` (or a peft adapter folder) writes it under `weights_dir` as
`adapter-<v>/` (a few MB), then pause → `/load_lora_adapter` under a name of its own for that
version → `/update_weight_version` → continue on every live server; every request sent afterwards
(the interrupted ones re-sent too) names it in `lora_path`, and the previous version's adapter is
unloaded. Full weights are still the base (`/update_weights_from_disk`); the adapter stays on top.
`close()` unloads the adapters this engine loaded from servers someone else runs (launched servers
are stopped).
With one adapter per agent (`AgentWeights` of `LoraAdapter`s, the Session's `agents`) each agent's
adapter is written as `adapter-<agent>-<v>/` and loaded under a name of its own in the same pause,
and each request names the adapter of its agent (`ModelRequest.agent`); a request from another
agent is refused (`UnknownAgentError`). SGLang batches requests of several adapters together.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from areal_nb.api import (
    AgentWeights,
    GenerationConfig,
    InvalidRequestError,
    LoraAdapter,
    ModelRequest,
    ModelResponse,
)
from areal_nb.errors import (  # noqa: F401 (re-exported)
    EngineRefused,
    EngineServerError,
    ServerDownError,
    UnknownAgentError,
)

from .sglang_wire import GeneratePayload, generate_payload, parse_generate_answer
from .weight_sync import write_adapter, write_weights

T = TypeVar("T")
# how long close() waits for servers someone else runs to unload this engine's adapters (a server
# answers once no request names the adapter any more)
UNLOAD_AT_CLOSE_S = 10.0


@dataclass(eq=False)
class _Server:
    url: str
    index: int
    in_flight: int = 0
    assigned: int = 0
    down: str | None = None  # why it was taken out
    tasks: set[asyncio.Task] = field(default_factory=set)


class _PrefixTable:
    """LRU of finished token sequences → the server that holds them in its prefix cache."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._table: collections.OrderedDict[tuple[int, int], _Server] = collections.OrderedDict()
        self._lengths: collections.Counter[int] = collections.Counter()

    def remember(self, tokens: Sequence[int], server: _Server) -> None:
        key = (len(tokens), hash(tuple(tokens)))
        if key in self._table:
            self._table.move_to_end(key)
        else:
            self._lengths[key[0]] += 1
        self._table[key] = server
        while len(self._table) > self.max_entries:
            (length, _), _ = self._table.popitem(last=False)
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]

    def lookup(self, prompt: Sequence[int]) -> _Server | None:
        """The server of the longest remembered sequence that is a strict prefix of `prompt`."""
        for length in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            server = self._table.get((length, hash(tuple(prompt[:length]))))
            if server is not None and server.down is None:
                return server
        return None


def refuse_constraint(g: GenerationConfig) -> None:
    """Structured output is refused here: SGLang can decode under a grammar, but its /generate
    reply says nothing of the mask each token was sampled under, so the record could not give the
    trainer the distribution the tokens came from."""
    if g.constraint is not None:
        raise InvalidRequestError(
            f"structured output ({g.constraint.kind}) needs engine.type: local: the remote engine's replies carry "
            "no sampling masks, so the trainer could not score its tokens under the distribution they were sampled from"
        )


class SGLangEngine:
    """Client of one or more SGLang-API servers; see the module docstring."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        api_key: str | None = None,
        weights_dir: str | os.PathLike | None = None,
        config_source: str | os.PathLike | None = None,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
        connect_timeout: float = 5.0,
        request_timeout: float | None = 3600.0,
        max_tracked_sequences: int = 65536,
        owned_processes: Sequence[Any] = (),
        max_context: int | None = None,
        check: bool = True,
        weights_wait: float = 120.0,
        lora: bool = False,
    ) -> None:
        """`addresses`: base URLs (`http://host:port`). `owned_processes`: launcher `ServerProcess`es
        this engine stops on `close()`. `max_context`: the model's context length, which the proxy
        uses to cap requests (servers do not report it in `/model_info`). `check`: read every server's `/model_info` now (a server that
        does not answer is marked down; none answering is an error) and adopt their weight version.
        `weights_wait`: how long a server's refusal of a weights folder is retried (with backoff)
        before `update_weights` fails: a folder written on one node may reach another node's view
        of a shared file system (NFS attribute caches) seconds later. `lora`: the servers serve
        LoRA adapters, and the trainer pushes its adapter, not merged weights (module docstring)."""
        urls = [addresses] if isinstance(addresses, str) else list(addresses)
        if not urls:
            raise ValueError("SGLangEngine needs at least one server address")
        self.servers = [_Server(url=_normalize_url(u), index=i) for i, u in enumerate(urls)]
        self.api_key = api_key
        self.weights_dir = weights_dir
        self.config_source = config_source
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        if (
            tokenizer is not None
            and tokenizer.eos_token_id is not None
            and tokenizer.eos_token_id not in self.eos_token_ids
        ):
            self.eos_token_ids.append(int(tokenizer.eos_token_id))
        self.owned_processes = list(owned_processes)
        self.max_context = max_context
        self._timeout = httpx.Timeout(connect=connect_timeout, read=request_timeout, write=60.0, pool=None)
        # the same limits for /generate, which goes to aiohttp directly (see _generate_on)
        self._generate_timeout = aiohttp.ClientTimeout(
            sock_connect=connect_timeout, sock_read=request_timeout
        )
        self._generate_headers = {"Content-Type": "application/json"}
        if api_key:
            self._generate_headers["Authorization"] = f"Bearer {api_key}"
        self._prefixes = _PrefixTable(max_tracked_sequences)
        self._tie_break = itertools.count()
        # server-side rids: unique per engine and attempt (uuid4 for each would read os.urandom each time)
        self._rid_prefix = uuid.uuid4().hex
        self._rid_counter = itertools.count()
        self._version = 0
        self.weights_wait = weights_wait
        self.serves_lora_adapters = lora  # the Actor reads this: push the adapter, not merged weights
        self._adapter: str | None = None  # the loaded adapter every request names (lora_path)
        self._agent_adapters: dict[str, str] = {}  # one adapter per agent: agent → loaded name
        self._adapter_count = itertools.count()
        self._pause_epoch = 0
        self._user_aborted: set[str] = set()
        self._attempts: dict[str, tuple[_Server, str]] = {}  # caller rid → (server, server rid)
        self._closed = False
        self._inbox: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future]] = []
        self._inbox_lock = threading.Lock()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="SGLangEngine-loop", daemon=True)
        self._thread.start()
        self._resumed: asyncio.Event = self._call(self._make_event())
        self._update_lock = asyncio.Lock()  # binds to the engine loop on first use
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient = self._call(self._make_client(headers))
        if check:
            try:
                self._call(self._acheck())
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ loop plumbing

    async def _make_event(self) -> asyncio.Event:
        event = asyncio.Event()
        event.set()
        return event

    async def _make_client(self, headers: dict[str, str]) -> httpx.AsyncClient:
        # httpx's API over aiohttp's connection pool (httpx-aiohttp, as the openai/anthropic SDKs
        # offer): httpcore's own pool scans every connection on every request event, which cost
        # 2-3 ms of CPU per /generate at 32 concurrent requests on the development machine, aiohttp
        # about 0.5 ms. No connection cap (limit=0): a capped pool would cap how many requests a
        # server batches. Idle connections are kept 60 s, less than the servers keep them (uvicorn
        # in engine-server: 300 s), so the client, not the server, closes an idle one: a request is
        # never sent on a connection the server is closing.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0))
        return httpx.AsyncClient(
            transport=AiohttpTransport(client=self._session), timeout=self._timeout, headers=headers
        )

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SGLangEngine's sync methods cannot run on its own loop; await the a-methods")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the engine loop from whatever loop awaits this; cancellation propagates."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            # outside the try above: a RuntimeError the coroutine raises (EngineServerError is one)
            # must reach the caller, not send the spent coroutine to _submit
            return await coro
        fut = self._submit(coro)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """`run_coroutine_threadsafe` for a burst: coroutines submitted before the engine loop
        wakes up start in one wake-up (one self-pipe write and one GIL hand-over for the burst, not
        one per request; the hand-overs are what spread a burst's sends over several milliseconds)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._inbox_lock:
            self._inbox.append((coro, fut))
            if len(self._inbox) > 1:
                return fut  # a wake-up is already on its way
        try:
            self._loop.call_soon_threadsafe(self._start_submitted)
        except RuntimeError:  # the loop is closed
            with self._inbox_lock:
                self._inbox.clear()
            coro.close()
            fut.set_exception(EngineServerError("SGLangEngine is closed"))
        return fut

    def _start_submitted(self) -> None:
        with self._inbox_lock:
            batch, self._inbox = self._inbox, []
        for coro, fut in batch:
            if fut.cancelled():  # the caller gave up before it started
                coro.close()
                continue
            task = self._loop.create_task(coro)
            task.add_done_callback(functools.partial(_copy_outcome, fut))
            fut.add_done_callback(functools.partial(_cancel_task_from_any_thread, self._loop, task))

    # ------------------------------------------------------------------ InferenceEngine

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        if self._closed:
            raise EngineServerError("SGLangEngine is closed")
        refuse_constraint(req.gconfig)
        return await self._on_loop(self._agenerate(req))

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Set the version servers report for their current weights (`/update_weight_version`)."""
        self._call(self.aset_version(version))

    def rng_state(self) -> None:
        """None: the servers sample with their own generators, which a checkpoint here cannot hold."""
        return None

    def set_rng_state(self, state: object) -> None:
        """Nothing to restore (see `rng_state`)."""

    def pause(self) -> None:
        self._call(self.apause())

    def resume(self) -> None:
        self._call(self.aresume())

    def update_weights(self, weights: Any, version: int | None = None) -> None:
        """New weights on every live server; tokens sampled afterwards carry `version`.

        `weights`: a directory the servers can read (under `weights_dir` for engine-server), a
        `PreTrainedModel` or a state dict (both written under `weights_dir` first); with
        `lora=True` also a `LoraAdapter` or a peft adapter folder (the module docstring)."""
        self._call(self.aupdate_weights(weights, version))

    def abort(self, rid: str) -> None:
        """Stop request `rid`: it returns its partial output with stop reason "abort"."""
        self._call(self.aabort(rid))

    def close(self) -> None:
        """Fail in-flight requests, close the HTTP client, stop the loop and owned servers. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._loop.is_running():
                try:
                    self._call(self._aclose(), timeout=30)
                except Exception:  # noqa: BLE001 - closing must go on
                    pass
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
            if not self._loop.is_running():
                self._loop.close()
        for proc in self.owned_processes:
            proc.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SGLangEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        live = sum(s.down is None for s in self.servers)
        return f"SGLangEngine({live}/{len(self.servers)} servers live, version {self._version})"

    # ------------------------------------------------------------------ info

    def server_status(self) -> list[dict[str, Any]]:
        return [
            {"url": s.url, "in_flight": s.in_flight, "assigned": s.assigned, "down": s.down}
            for s in self.servers
        ]

    def model_info(self) -> list[dict[str, Any]]:
        """`/model_info` of every live server (falls back to `/get_model_info` on a 404)."""
        return self._call(self.amodel_info())

    async def amodel_info(self) -> list[dict[str, Any]]:
        return await self._on_loop(self._gather_live(self._model_info))

    def health(self) -> list[bool]:
        return self._call(self.ahealth())

    async def ahealth(self) -> list[bool]:
        async def one(server: _Server) -> bool:
            try:
                return (await self._client.get(f"{server.url}/health")).status_code == 200
            except httpx.TransportError:
                return False

        async def run() -> list[bool]:
            return list(await asyncio.gather(*(one(s) for s in self._live())))

        return await self._on_loop(run())

    # ------------------------------------------------------------------ async control

    async def apause(self) -> None:
        async def run() -> None:
            self._resumed.clear()
            self._pause_epoch += 1
            await self._gather_live(lambda s: self._post(s, "/pause_generation", {"mode": "abort"}))

        await self._on_loop(run())

    async def aresume(self) -> None:
        async def run() -> None:
            try:
                await self._gather_live(lambda s: self._post(s, "/continue_generation", {}))
            finally:
                self._resumed.set()

        await self._on_loop(run())

    async def aset_version(self, version: int) -> None:
        async def run() -> None:
            body = {"new_version": str(int(version)), "abort_all_requests": False}
            await self._gather_live(lambda s: self._post(s, "/update_weight_version", body))
            self._version = int(version)

        await self._on_loop(run())

    async def aupdate_weights(self, weights: Any, version: int | None = None) -> None:
        if isinstance(weights, AgentWeights):
            await self._aupdate_agent_adapters(weights, version)
            return
        if isinstance(weights, LoraAdapter) or (
            isinstance(weights, (str, os.PathLike))
            and os.path.isfile(os.path.join(weights, "adapter_config.json"))
        ):
            await self._aupdate_adapter(weights, version)
            return
        if isinstance(weights, (str, os.PathLike)):
            path = os.path.abspath(weights)
        else:
            if self.weights_dir is None:
                raise ValueError(
                    "SGLangEngine.update_weights with tensors needs weights_dir (a directory the servers share)"
                )
            target = self._version + 1 if version is None else int(version)
            # written in a worker thread: serialising weights must not stall the engine loop
            path = str(
                await asyncio.to_thread(
                    write_weights, self.weights_dir, target, weights, config_source=self.config_source
                )
            )
        await self._on_loop(self._aupdate_from_disk(path, version))

    async def _aupdate_from_disk(self, path: str, version: int | None) -> None:
        body: dict[str, Any] = {"model_path": path, "flush_cache": True, "abort_all_requests": False}
        if version is not None:
            body["weight_version"] = str(int(version))
        # update_weights_from_disk needs no begin/end_weight_update session (only the tensor and
        # distributed updates do in sglang >= 0.5.21; docs/reference/sglang-api.md, "Weight updates")
        async with self._update_lock:  # one update at a time: pause/continue must not interleave
            await self.apause()
            try:
                await self._gather_live(lambda s: self._update_from_disk_on(s, body))
                if version is not None:
                    self._version = int(version)
            finally:
                await self.aresume()

    async def _update_from_disk_on(
        self, server: _Server, body: dict[str, Any], route: str = "/update_weights_from_disk"
    ) -> None:
        """`/update_weights_from_disk` (or `/load_lora_adapter`) on one server; a refusal (the
        folder not visible there yet, or not complete) is retried with backoff for `weights_wait`
        s, then raised with the path. A refused update changes nothing on the server (SGLang and
        engine-server keep the old weights, adapters and version), so trying again is safe."""
        deadline = time.monotonic() + self.weights_wait
        delay, attempts = 0.25, 0
        path = body.get("model_path") or body.get("lora_path")
        while True:
            attempts += 1
            try:
                await self._post(server, route, body)
                return
            except ServerDownError:
                raise
            except (ValueError, EngineServerError) as exc:
                if "LoRA is not enabled" in str(exc):  # no retry can change a server's flags
                    raise EngineServerError(
                        f"engine server {server.url} serves no LoRA adapters ({exc}): start it with "
                        "--enable-lora --max-lora-rank R --lora-target-modules ... (engine.type: sglang "
                        "passes them when actor.lora is set)"
                    ) from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineServerError(
                        f"engine server {server.url} refused the {'adapter' if route != '/update_weights_from_disk' else 'weights'} "
                        f"at {path} {attempts} time(s) over {self.weights_wait:g} s; last answer: {exc}"
                    ) from exc
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 8.0)

    async def _aupdate_adapter(self, adapter: LoraAdapter | str | os.PathLike, version: int | None) -> None:
        """The adapter on every live server under a new name, used by every request from now on
        (see the module docstring)."""
        if not self.serves_lora_adapters:
            raise ValueError(
                "this SGLangEngine was not made for LoRA adapters (lora=False): its servers may not "
                "have been started with --enable-lora"
            )
        target = self._version + 1 if version is None else int(version)
        if isinstance(adapter, LoraAdapter):
            if self.weights_dir is None:
                raise ValueError(
                    "SGLangEngine needs weights_dir (a directory the servers share) to push adapters"
                )
            path = str(await asyncio.to_thread(write_adapter, self.weights_dir, target, adapter))
        else:
            path = os.path.abspath(adapter)
        await self._on_loop(self._aload_adapter(path, target))

    async def _aupdate_agent_adapters(self, weights: AgentWeights, version: int | None) -> None:
        """Each agent's adapter on every live server under a new name, each request naming its
        agent's from now on (see the module docstring)."""
        if not self.serves_lora_adapters or self.weights_dir is None:
            raise ValueError(
                "one adapter per agent needs servers that serve LoRA adapters (lora=True) and weights_dir"
            )
        strangers = [a for a, w in weights.per_agent.items() if not isinstance(w, LoraAdapter)]
        if strangers:
            raise ValueError(f"AgentWeights for SGLangEngine hold LoraAdapters; agent(s) {strangers} do not")
        target = self._version + 1 if version is None else int(version)
        weights_dir = self.weights_dir
        paths = {
            agent: str(await asyncio.to_thread(write_adapter, weights_dir, target, adapter, agent=agent))
            for agent, adapter in weights.per_agent.items()
        }
        await self._on_loop(self._aload_adapters(paths, target))

    async def _aload_adapter(self, path: str, version: int) -> None:
        await self._aload_adapters({None: path}, version)

    async def _aload_adapters(self, paths: dict[str | None, str], version: int) -> None:
        """Load `paths` (agent → adapter folder; None: the one policy's) in one pause; the
        requests sent afterwards name them, and the adapters they replace are unloaded."""
        # a name per push: a version pushed twice (a restored run) never meets its own name
        names = {
            agent: f"{agent or 'policy'}-v{version}-{self._rid_prefix[:8]}-{next(self._adapter_count)}"
            for agent in paths
        }
        set_version = {"new_version": str(version), "abort_all_requests": False}
        async with self._update_lock:
            await self.apause()  # requests in flight come back and are re-sent naming the new adapters
            try:
                for agent, path in paths.items():
                    load = load_adapter_body(names[agent], path)
                    await self._gather_live(
                        lambda s, load=load: self._update_from_disk_on(s, load, "/load_lora_adapter")
                    )
                await self._gather_live(lambda s: self._post(s, "/update_weight_version", set_version))
                if None in names:
                    previous = [self._adapter] if self._adapter is not None else []
                    self._adapter = names[None]
                else:
                    previous = list(self._agent_adapters.values())
                    self._agent_adapters = {str(a): n for a, n in names.items()}
                self._version = version
            finally:
                await self.aresume()
            for name in previous:  # (the servers answer once no request names it any more)
                unload = unload_adapter_body(name)
                await self._gather_live(
                    lambda s, unload=unload: self._post(s, "/unload_lora_adapter", unload)
                )

    def _adapter_of(self, agent: str | None) -> str | None:
        """The adapter a request of `agent` names: its agent's (one adapter per agent, refusing
        other agents), else the one policy's (None: the base)."""
        if not self._agent_adapters:
            return self._adapter
        if agent in self._agent_adapters:
            return self._agent_adapters[agent]
        raise UnknownAgentError.of(agent, self._agent_adapters)

    async def aabort(self, rid: str) -> None:
        async def run() -> None:
            self._user_aborted.add(rid)
            attempt = self._attempts.get(rid)
            if attempt is not None and attempt[0].down is None:
                await self._post(attempt[0], "/abort_request", {"rid": attempt[1]})

        await self._on_loop(run())

    # ------------------------------------------------------------------ generation (engine loop)

    async def _agenerate(self, req: ModelRequest) -> ModelResponse:
        g = req.gconfig
        if g.n_samples != 1:
            raise ValueError(f"SGLangEngine sends one sample per request, got n_samples={g.n_samples}")
        prompt = list(req.input_ids)
        self._adapter_of(req.agent)  # a request of an agent with no adapter is refused before it is sent
        budget = min(g.max_new_tokens, g.max_tokens - len(prompt))
        if budget <= 0:
            raise ValueError(
                f"no room to generate: max_new_tokens={g.max_new_tokens}, max_tokens={g.max_tokens}, "
                f"prompt of {len(prompt)} tokens"
            )
        start = time.perf_counter()
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        server = self._route(prompt)
        self._user_aborted.discard(req.rid)
        try:
            while True:
                await self._resumed.wait()
                if server.down is not None:
                    server = self._route(prompt + tokens)
                epoch = self._pause_epoch
                payload = generate_payload(
                    prompt + tokens,
                    budget - len(tokens),
                    g,
                    len(tokens),
                    server_rid(self._rid_prefix, next(self._rid_counter)),
                    self._adapter_of(req.agent),
                )
                self._attempts[req.rid] = (server, payload["rid"])
                answer = parse_generate_answer(
                    await self._generate_on(server, payload), server.url, self._parse_version
                )
                tokens += answer.tokens
                logprobs += answer.logprobs
                versions += answer.versions
                reason = answer.stop_reason
                interrupted = (
                    reason == "abort"
                    and req.rid not in self._user_aborted
                    and (epoch != self._pause_epoch or not self._resumed.is_set())
                )
                if not interrupted or len(tokens) >= budget:
                    if interrupted:
                        reason = "length"  # the budget ran out exactly at the pause
                    break
        finally:
            self._attempts.pop(req.rid, None)
            self._user_aborted.discard(req.rid)
        self._prefixes.remember(prompt + tokens, server)
        return ModelResponse(
            input_tokens=prompt,
            output_tokens=tokens,
            output_logprobs=logprobs,
            output_versions=versions,
            stop_reason=reason,
            latency=time.perf_counter() - start,
            ttft=0.0,  # not reported by a non-streaming /generate
            tokenizer=self.tokenizer,
            eos_token_ids=list(self.eos_token_ids),
        )

    def _live(self) -> list[_Server]:
        return [s for s in self.servers if s.down is None]

    def _route(self, prompt: Sequence[int]) -> _Server:
        live = self._live()
        if not live:
            reasons = "; ".join(f"{s.url}: {s.down}" for s in self.servers)
            raise ServerDownError(f"no live engine server left ({reasons})")
        server = self._prefixes.lookup(prompt)
        if server is None:
            server = min(live, key=lambda s: (s.in_flight, s.assigned, next(self._tie_break)))
        server.assigned += 1
        return server

    async def _generate_on(self, server: _Server, payload: GeneratePayload) -> Any:
        task = asyncio.current_task()
        assert task is not None
        server.in_flight += 1
        server.tasks.add(task)
        try:
            # The hot path skips httpx's request/response objects and goes to the aiohttp session
            # under it (same pool, same timeouts, aiohttp's errors mapped to httpx's as on every
            # other call), with an orjson body: that halved the client's CPU per /generate
            # (0.57 -> 0.28 ms), which is what spaces the requests of a burst apart on the wire.
            with map_aiohttp_exceptions():
                async with self._session.post(
                    f"{server.url}/generate",
                    data=orjson.dumps(payload),
                    headers=self._generate_headers,
                    timeout=self._generate_timeout,
                ) as reply:
                    status, body = reply.status, await reply.read()
        except httpx.TransportError as exc:
            reason = _transport_reason(exc)
            # A dropped connection is not always a dead server (a keep-alive connection closed as
            # it was reused; measured once in a 60-step run): only a server that also fails
            # /health is taken out. Either way this request failed.
            if await self._answers_health(server):
                raise EngineServerError(
                    f"engine server {server.url}: request failed ({reason}); "
                    "the server is up and stays in use"
                ) from exc
            self._mark_down(server, reason)
            raise ServerDownError(
                f"engine server {server.url} is down ({server.down}); request failed"
            ) from exc
        except asyncio.CancelledError:
            if self._closed:
                raise EngineServerError("SGLangEngine was closed before the request finished") from None
            if server.down is None:  # the caller gave up: free the server's slot too
                asyncio.get_running_loop().create_task(self._abort_quietly(server, payload["rid"]))
            raise
        finally:
            server.in_flight -= 1
            server.tasks.discard(task)
        if status == 200 and body:  # the hot path: no httpx.Response to build
            try:
                return orjson.loads(body)
            except orjson.JSONDecodeError:
                pass  # _json_or_raise words the error
        return _json_or_raise(httpx.Response(status, content=body), server.url, "/generate")

    async def _answers_health(self, server: _Server) -> bool:
        try:
            response = await self._client.get(f"{server.url}/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _abort_quietly(self, server: _Server, server_rid: str) -> None:
        try:
            await self._client.post(f"{server.url}/abort_request", json={"rid": server_rid})
        except httpx.HTTPError:
            pass

    def _mark_down(self, server: _Server, reason: str) -> None:
        if server.down is None:
            server.down = reason

    def _parse_version(self, value: Any) -> int:
        # a server that never had a versioned update reports "default" (sglang's --weight-version)
        try:
            return int(value)
        except (TypeError, ValueError):
            return self._version

    # ------------------------------------------------------------------ control helpers (engine loop)

    async def _post(self, server: _Server, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self._client.post(f"{server.url}{path}", json=body)
        except httpx.TransportError as exc:
            self._mark_down(server, f"{_transport_reason(exc)} on {path}")
            raise ServerDownError(f"engine server {server.url} is down ({server.down})") from exc
        data = _json_or_raise(response, server.url, path)
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineServerError(
                f"{server.url}{path} failed: {data.get('message') or data.get('error_message')}"
            )
        return data

    async def _model_info(self, server: _Server) -> dict[str, Any]:
        try:
            response = await self._client.get(f"{server.url}/model_info")
            if response.status_code == 404:  # sglang before /model_info existed
                response = await self._client.get(f"{server.url}/get_model_info")
        except httpx.TransportError as exc:
            self._mark_down(server, f"{_transport_reason(exc)} on /model_info")
            raise ServerDownError(f"engine server {server.url} is down ({server.down})") from exc
        return _json_or_raise(response, server.url, "/model_info")

    async def _gather_live(self, fn) -> list[Any]:
        """Run `fn(server)` on every live server; raise the first error after all have finished.

        A server found dead on the way is only taken out (the others carry on without it), unless
        none is left."""
        live = self._live()
        results = await asyncio.gather(*(fn(s) for s in live), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, ServerDownError)]
        if errors:
            raise errors[0]
        if not self._live():
            reasons = "; ".join(f"{s.url}: {s.down}" for s in self.servers)
            raise ServerDownError(f"no live engine server left ({reasons})")
        return [r for r in results if not isinstance(r, BaseException)]

    async def _acheck(self) -> None:
        results = await asyncio.gather(*(self._model_info(s) for s in self.servers), return_exceptions=True)
        infos = [r for r in results if not isinstance(r, BaseException)]
        if not infos:
            raise ServerDownError(f"no engine server answered: {[str(r) for r in results]}")
        for r in results:
            if isinstance(r, EngineServerError) and not isinstance(r, ServerDownError):
                raise r
        versions = {self._parse_version(info.get("weight_version")) for info in infos}
        if len(versions) == 1:
            self._version = versions.pop()

    async def _aclose(self) -> None:
        for server in self.servers:
            for task in list(server.tasks):
                task.cancel()
        await asyncio.sleep(0)
        await self._unload_adapters()
        await self._client.aclose()

    async def _unload_adapters(self) -> None:
        """Servers someone else runs keep serving after this engine: the adapters it loaded are
        unloaded, so runs that come and go do not fill their adapter memory. Launched servers are
        stopped instead. Best effort, within UNLOAD_AT_CLOSE_S."""
        names = [*([self._adapter] if self._adapter else []), *self._agent_adapters.values()]
        if self.owned_processes or not names:
            return
        unloads = [
            self._post(server, "/unload_lora_adapter", unload_adapter_body(name))
            for name in names
            for server in self.servers
            if server.down is None
        ]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*unloads, return_exceptions=True), UNLOAD_AT_CLOSE_S)
        self._adapter, self._agent_adapters = None, {}


def _copy_outcome(fut: concurrent.futures.Future, task: asyncio.Task) -> None:
    # `fut` stays pending while the task runs, so the caller can still cancel it (and with it the task)
    if task.cancelled():
        fut.cancel()
    elif not fut.set_running_or_notify_cancel():  # cancelled by the caller meanwhile
        return
    elif task.exception() is not None:
        fut.set_exception(task.exception())
    else:
        fut.set_result(task.result())


def _cancel_task_from_any_thread(
    loop: asyncio.AbstractEventLoop, task: asyncio.Task, fut: concurrent.futures.Future
) -> None:
    if fut.cancelled() and not task.done():
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closed
            pass


# ---------------------------------------------------------------------- wire helpers


def server_rid(prefix: str, n: int) -> str:
    """The n-th server-side request id: `prefix` and n in 16 hex digits, so every id has one length
    and none is a prefix of another (SGLang aborts every request whose rid starts with the one
    named: with `p-1`, aborting `p-1` would also abort `p-10` ... `p-19`, `p-100` ...)."""
    return f"{prefix}-{n:016x}"


def _normalize_url(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


_generate_payload = generate_payload  # the name tests/engine/test_sglang_source.py imports


def load_adapter_body(name: str, path: str) -> dict[str, Any]:
    """The `/load_lora_adapter` body: the adapter folder `path` under `name` (SGLang's
    `LoadLoRAAdapterReqInput`; unpinned: SGLang may evict it from its GPU slots when idle)."""
    return {"lora_name": name, "lora_path": path, "pinned": False}


def unload_adapter_body(name: str) -> dict[str, Any]:
    """The `/unload_lora_adapter` body (SGLang's `UnloadLoRAAdapterReqInput`)."""
    return {"lora_name": name}


def _transport_reason(exc: httpx.TransportError) -> str:
    """What failed, named by the underlying error (aiohttp's ServerDisconnectedError, ...)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and body.get("error_message"):  # a LoRA route's LoRAUpdateOutput
        return str(body["error_message"])
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def _json_or_raise(response: httpx.Response, url: str, path: str) -> Any:
    if response.status_code == 400:
        raise EngineRefused(f"engine server {url}{path} rejected the request: {_error_message(response)}")
    if response.status_code != 200:
        raise EngineServerError(
            f"engine server {url}{path} answered {response.status_code}: {_error_message(response)}"
        )
    if not response.content:
        return None
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise EngineServerError(
            f"engine server {url}{path} sent invalid JSON: {response.text[:200]!r}"
        ) from exc

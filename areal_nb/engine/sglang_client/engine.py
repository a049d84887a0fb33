"""`SGLangEngine`: an `InferenceEngine` that generates on SGLang servers (or `areal-nb engine-server`).

Token in, token out through SGLang's native API (`docs/reference/sglang-api.md`): `POST /generate` with
`input_ids`, the closed `sampling_params` key set and `return_logprob` (`sglang_wire.py` builds the
payload and parses the answer): tokens and log-probs come from `meta_info.output_token_logprobs`,
the stop reason from `finish_reason.type`, one version per token from `meta_info.weight_versions`
spans (0.5.20+) or else the single `meta_info.weight_version`.

Threads. The engine owns one event loop in a daemon thread (`loop.py`) and one aiohttp connection
pool on it (`transport.py`); every HTTP call runs there. `agenerate` may be awaited from any loop in
any thread (like `LocalEngine`), and the sync control methods (`pause`, `resume`, `update_weights`,
`set_version`, `close`) may be called from any thread but the engine's own.

Servers. `routing.py` picks the server of a request (the one whose prefix cache holds the
conversation, else the least loaded) and keeps servers found dead out for good; with no live server
left, `agenerate` fails at once.

Pause and weight updates. `pause()` sends `/pause_generation` in `abort` mode: in-flight requests come
back with partial output and are re-sent, after `resume()`, with the partial output appended to the
prompt and the remaining token budget (AReaL's interruption loop), so a caller sees one response whose
per-token versions show both weight versions. Full weights: `weights.py`; LoRA adapters (`lora=True`),
one per policy or one per agent: `adapters.py`. An explicit `abort(rid)` returns the partial output
with stop reason "abort".
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp
import httpx

from areal_nb.api import (
    AgentWeights,
    GenerationConfig,
    InferenceEngine,
    InvalidRequestError,
    LoraAdapter,
    ModelRequest,
    ModelResponse,
)
from areal_nb.errors import EngineServerError, InvalidArgumentError, ServerDownError, WeightUpdateError

from ..sglang_wire import generate_payload, parse_generate_answer
from ..weight_sync import write_weights
from .adapters import AdapterUpdates
from .loop import EngineLoop
from .routing import Server, ServerPool, server_rid

T = TypeVar("T")


def refuse_constraint(g: GenerationConfig) -> None:
    """Structured output is refused here: SGLang can decode under a grammar, but its /generate
    reply says nothing of the mask each token was sampled under, so the record could not give the
    trainer the distribution the tokens came from."""
    if g.constraint is not None:
        raise InvalidRequestError(
            f"structured output ({g.constraint.kind}) needs engine.type: local: the remote engine's replies carry "
            "no sampling masks, so the trainer could not score its tokens under the distribution they were sampled from"
        )


class SGLangEngine(AdapterUpdates, InferenceEngine):
    """Client of one or more SGLang-API servers; see the module docstring."""

    # capabilities (`InferenceEngine`): max_context, serves_lora_adapters and weights_may_differ
    # are set per instance
    records_sampling_masks = False  # SGLang's replies do not say what each token was drawn among
    serves_models_in_process = False  # the servers load their model from a folder
    shares_weights = False  # (the servers hold their own copy)
    stats = None  # the servers keep their own counters

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
        weights_may_differ: bool = False,
    ) -> None:
        # (long: it sets, in one place, every attribute the base classes in transport.py,
        # weights.py and adapters.py share with the engine)
        """`addresses`: base URLs (`http://host:port`). `owned_processes`: launcher `ServerProcess`es
        this engine stops on `close()`. `max_context`: the model's context length, which the proxy
        uses to cap requests (servers do not report it in `/model_info`). `check`: read every server's `/model_info` now (a server that
        does not answer is marked down; none answering is an error) and adopt their weight version.
        `weights_wait`: how long a server's refusal of a weights folder is retried (with backoff)
        before `update_weights` fails: a folder written on one node may reach another node's view
        of a shared file system (NFS attribute caches) seconds later. `lora`: the servers serve
        LoRA adapters, and the trainer pushes its adapter, not merged weights (module docstring).
        `weights_may_differ`: the servers were started by someone else and may serve other weights
        than the model's (the Session then pushes the trainer's before the first rollout)."""
        urls = [addresses] if isinstance(addresses, str) else list(addresses)
        if not urls:
            raise InvalidArgumentError("SGLangEngine needs at least one server address")
        self._pool = ServerPool(urls, max_tracked_sequences)
        self.servers = self._pool.servers
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
        # server-side rids: unique per engine and attempt (uuid4 for each would read os.urandom each time)
        self._rid_prefix = uuid.uuid4().hex
        self._rid_counter = itertools.count()
        self._version = 0
        self.weights_wait = weights_wait
        self.serves_lora_adapters = lora  # the Actor reads this: push the adapter, not merged weights
        self.weights_may_differ = weights_may_differ
        self._adapter: str | None = None  # the loaded adapter every request names (lora_path)
        self._agent_adapters: dict[str, str] = {}  # one adapter per agent: agent → loaded name
        self._adapter_count = itertools.count()
        self._pause_epoch = 0
        self._user_aborted: set[str] = set()
        self._attempts: dict[str, tuple[Server, str]] = {}  # caller rid → (server, server rid)
        self._closed = False
        self._runner = EngineLoop("SGLangEngine-loop")
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

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._runner.call(coro, timeout)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the engine loop from whatever loop awaits this; cancellation propagates."""
        return await self._runner.run(coro)

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

    def abort_all(self) -> None:
        """Not offered by this client (the `InferenceEngine` default): requests in flight finish;
        `abort(rid)` stops one."""

    def drop_caches(self) -> None:
        """Nothing here (the `InferenceEngine` default): the servers hold their memory in their own
        processes, and free their caches on a weight update themselves."""

    def close(self) -> None:
        """Fail in-flight requests, close the HTTP client, stop the loop and owned servers. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._runner.loop.is_running():
                try:
                    self._call(self._aclose(), timeout=30)
                except Exception:  # noqa: BLE001 - closing must go on
                    pass
            self._runner.stop()
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
        async def one(server: Server) -> bool:
            try:
                return (await self._client.get(f"{server.url}/health")).status_code == 200
            except httpx.TransportError:
                return False

        async def run() -> list[bool]:
            return list(await asyncio.gather(*(one(s) for s in self._pool.live())))

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
                raise WeightUpdateError(
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

    async def aabort(self, rid: str) -> None:
        async def run() -> None:
            self._user_aborted.add(rid)
            attempt = self._attempts.get(rid)
            if attempt is not None and attempt[0].down is None:
                await self._post(attempt[0], "/abort_request", {"rid": attempt[1]})

        await self._on_loop(run())

    # ------------------------------------------------------------------ generation (engine loop)

    # Long: AReaL's interruption loop (send → aborted by a pause → re-send the rest) reads best
    # as one piece, its bookkeeping of tokens, versions and attempts beside it.
    async def _agenerate(self, req: ModelRequest) -> ModelResponse:
        g = req.gconfig
        if g.n_samples != 1:
            raise InvalidArgumentError(
                f"SGLangEngine sends one sample per request, got n_samples={g.n_samples}"
            )
        prompt = list(req.input_ids)
        self._adapter_of(req.agent)  # a request of an agent with no adapter is refused before it is sent
        budget = min(g.max_new_tokens, g.max_tokens - len(prompt))
        if budget <= 0:
            raise InvalidArgumentError(
                f"no room to generate: max_new_tokens={g.max_new_tokens}, max_tokens={g.max_tokens}, "
                f"prompt of {len(prompt)} tokens"
            )
        start = time.perf_counter()
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        server = self._pool.route(prompt)
        self._user_aborted.discard(req.rid)
        try:
            while True:
                await self._resumed.wait()
                if server.down is not None:
                    server = self._pool.route(prompt + tokens)
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
        self._pool.prefixes.remember(prompt + tokens, server)
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

    def _parse_version(self, value: Any) -> int:
        # a server that never had a versioned update reports "default" (sglang's --weight-version)
        try:
            return int(value)
        except (TypeError, ValueError):
            return self._version

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

"""`LocalEngine`: the embedded inference engine, a transformers model with continuous batching.

One worker thread owns the model. Each scheduler iteration it
1. applies pending weight updates and aborts (also while paused),
2. admits waiting requests (one prefill for all that arrived together, into free rows of the batch),
3. runs one batched decode step over every active row, samples one token per row,
4. retires finished rows, which leave the batch at once (the last rows move into their slots).
Requests that arrive while others decode join the running batch at the next iteration; the KV
cache of running rows is kept (see `kv_batch.PaddedKVBatch`).

Why not transformers' own `ContinuousBatchingManager` (transformers 5.24): its sampling settings
(temperature, top-p/top-k, greedy) are fixed per manager, not per request; its log-probs are taken
after the logits processors, i.e. after top-k/top-p truncation (we need `log_softmax(logits / T)`
before truncation); it has no notion of a weight version per token nor of applying a weight update
between two steps; and its paged-attention path is built around CUDA. So this module is a small
step scheduler of our own over transformers' cache layers, with the model's stock forward or, for
the Llama, Mistral, Qwen2, Qwen3 and Gemma families, the equivalent lean forward in `lean_forward`
(less per-step overhead).

Every output token carries its log-probability and the engine version at the moment it was
sampled. Weight updates keep the KV cache of in-flight rows (computed by the old weights), as
SGLang does when it updates without aborting.

Finished rows leave their keys/values in a prefix cache (`prefix_cache`, bounded by
`prefix_cache_tokens`; 0 disables it): a request whose prompt continues a finished sequence (a
multi-turn agent's next turn) loads those columns and prefills only its new tokens, in the same
forward as the other admissions. The cache holds only KV computed entirely by the current weights:
it is emptied on every weight update, rows that were in flight across an update are not kept, nor
are aborted or failed rows, and any failed step empties it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from areal_nb.api import InferenceEngine, ModelRequest, ModelResponse, SamplingMasks
from areal_nb.api.constraints import TokenGrammar
from areal_nb.errors import (
    CallOrderError,
    EngineClosedError,  # noqa: F401 (re-exported)
    InvalidArgumentError,
)

from .defaults import DEFAULT_MAX_BATCH_SIZE, DEFAULT_PREFIX_CACHE_TOKENS, DEFAULT_SINGLE_THREAD_ROWS
from .kv_batch import PaddedKVBatch, compact_order
from .prefix_cache import CachedPrefix, PrefixCache
from .request_plan import RequestPlan, plan_request
from .sampling import sample_masked, sample_next_tokens
from .weights import can_share_weights, check_weights, copy_weights_into, load_engine_model, read_weights_dir

logger = logging.getLogger(__name__)

Delivery = Callable[[ModelResponse | BaseException], None]

# Why decoding steps of up to DEFAULT_SINGLE_THREAD_ROWS (64) rows run on one torch thread (CPU).
# Measured on this project's 2-core machine (decoding steps of the 6.4 M Qwen2 of benchmarks/engine_throughput.py, 1 vs 2
# threads alternating in one process, minimum wall time per step at load average 3): 4.9 vs 5.5 ms
# at 8 rows, 10.0 vs 10.6 at 32, 16.9 vs 18.0 at 64, 33.0 vs 31.7 at 128. Waking the second OpenMP
# thread for each of a step's ~150 small operations costs more than it saves until the matmuls
# are large. That holds where other threads want the cores (the Session's agents and proxy: its
# rollouts measured the same with 0 and 64 on a quiet machine). An engine alone on a quiet machine
# is the other way round: with OpenMP's default spin-waiting, every step on both threads
# (single_thread_rows=0) gave 2,065 vs 1,498 tok/s at 8 rows, 3,606 vs 2,756 at 32 and 4,571-5,030
# vs 3,864-4,881 at 128 (benchmarks/engine_throughput.py's requests, load 1).


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` intra-op threads in this thread (None: unchanged).

    `torch.set_num_threads` sets the calling thread's OpenMP and MKL thread counts (and the count
    new threads start with), so it is restored at once: other threads keep theirs.
    """
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    if before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _RateLimitedLog:
    """Log an error at most once per `interval` seconds, counting the repeats left out.

    A fault that recurs on every scheduler iteration must not write millions of lines.
    """

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last = -float("inf")
        self._suppressed = 0

    def exception(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} similar errors not logged in the last {self.interval:g} s)"
        self._last, self._suppressed = now, 0
        logger.exception(message, *args)


@dataclass
class EngineStats:
    """Counters for benchmarks and tests (read-only for users)."""

    prefills: int = 0
    decode_steps: int = 0
    tokens: int = 0
    max_active: int = 0  # most rows ever decoded together in one step
    joined_running_batch: int = 0  # requests admitted while other rows were mid-generation
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    prefix_cache_hits: int = 0  # admitted requests whose prompt continued a cached sequence
    prefix_cache_tokens: int = 0  # prompt tokens loaded from the prefix cache instead of computed
    prefill_positions: int = 0  # positions the prefill forwards computed (padding included)


@dataclass(eq=False)
class _Row:
    plan: RequestPlan
    deliver: Delivery
    submitted: float
    first_token_at: float | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop_reason: str | None = None
    aborted: bool = False  # set from any thread; the worker finishes the row with "abort"
    error: BaseException | None = None  # set by the worker: the row leaves the batch failed
    checked_text_len: int = 0  # decoded output text already searched for stop strings
    epoch: int = -1  # the engine's weight epoch when the row was admitted (worker-only)
    prefix: CachedPrefix | None = None  # the prefix cache entry its prompt continued
    grammar: TokenGrammar | None = None  # structured output: the constraint's state over the output
    masked: bool = False  # sampled under a mask (grammar, top-k/top-p, banned ids): recorded below
    kept: list[list[int] | None] = field(default_factory=list)  # per token, see SamplingMasks
    sampled_logprobs: list[float] = field(default_factory=list)  # per token, under the masked distribution


@dataclass
class _WeightUpdate:
    weights: dict[str, torch.Tensor]
    version: int | None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class LocalEngine(InferenceEngine):
    """In-process engine; see the module docstring."""

    # capabilities (`InferenceEngine`): max_context, stats and shares_weights are set per instance
    serves_lora_adapters = False  # a LoRA policy comes as base + ΔW merged into full weights
    weights_may_differ = False  # it serves the model it is given, then what the trainer pushes
    records_sampling_masks = True  # each token's allowed set (ModelResponse.sampling_masks)
    serves_models_in_process = True

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        seed: int = 0,
        fast_forward: bool = True,
        single_thread_rows: int = DEFAULT_SINGLE_THREAD_ROWS,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        share_weights: bool = False,
    ) -> None:
        """`fast_forward=False` forces transformers' stock forward even where the lean one applies;
        `single_thread_rows`: on CPU, decoding steps of at most this many rows run on one torch
        thread (see the comment on `DEFAULT_SINGLE_THREAD_ROWS` above; 0: never); `prefix_cache_tokens` bounds the prefix cache
        (tokens of KV kept, 0: no cache).

        `share_weights=True`, for a loaded `model` whose parameters already are `dtype` tensors on
        `device`: serve those tensors themselves, no copy (`shares_weights` says whether it
        does). Whoever changes them in place (a trainer's optimizer step) must do so while the
        engine is paused and then `update_weights` with them (no copy: a version change between
        two decoding steps), so every token carries the version of the weights that sampled it."""
        if max_batch_size < 1:
            raise InvalidArgumentError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if single_thread_rows < 0:
            raise InvalidArgumentError(f"single_thread_rows must be >= 0, got {single_thread_rows}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.shares_weights = share_weights and can_share_weights(model, self.device, dtype)
        self.model, self.tokenizer = load_engine_model(
            model, tokenizer, self.device, dtype, share_weights=self.shares_weights
        )
        self.max_batch_size = max_batch_size
        self.single_thread_rows = single_thread_rows if self.device.type == "cpu" else 0
        self.max_context = int(self.model.config.max_position_embeddings)
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.eos_token_ids = self._eos_ids()
        self.stats = EngineStats()

        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = 0
        self._batch = PaddedKVBatch(self.model, fast_forward=fast_forward, max_rows=max_batch_size)
        self._active: list[_Row] = []  # aligned with the rows of self._batch; worker-only
        self.prefix_cache = PrefixCache(prefix_cache_tokens)  # worker-only
        self._epoch = 0  # +1 on every weight update: KV of an older epoch is not kept

        self._cond = threading.Condition()
        self._waiting: deque[_Row] = deque()
        self._live: set[_Row] = set()  # every submitted, unfinished row
        self._updates: deque[_WeightUpdate] = deque()
        self._abort_pending = False
        self._paused = False
        self._closed = False
        self._in_step = False
        self._errors = _RateLimitedLog()
        self._thread = threading.Thread(target=self._run, name="LocalEngine-worker", daemon=True)
        self._thread.start()

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for tid in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if tid is not None and int(tid) not in ids:
                ids.append(int(tid))
        return ids

    # ------------------------------------------------------------------ public API

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate for `req`; callable from any asyncio loop in any thread."""
        plan = self._plan(req)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ModelResponse] = loop.create_future()

        def resolve(value: ModelResponse | BaseException) -> None:
            if fut.done():
                return
            if isinstance(value, BaseException):
                fut.set_exception(value)
            else:
                fut.set_result(value)

        def deliver(value: ModelResponse | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(resolve, value)
            except RuntimeError:  # the caller's loop is closed: nobody waits for this any more
                pass

        row = self._submit(plan, deliver)
        try:
            return await fut
        except asyncio.CancelledError:
            self._abort_rows([row])
            raise

    def generate(self, req: ModelRequest) -> ModelResponse:
        """Blocking twin of `agenerate`."""
        if threading.current_thread() is self._thread:
            raise CallOrderError("LocalEngine.generate cannot be called from the engine's own worker thread")
        plan = self._plan(req)
        result: concurrent.futures.Future[ModelResponse] = concurrent.futures.Future()

        def deliver(value: ModelResponse | BaseException) -> None:
            if isinstance(value, BaseException):
                result.set_exception(value)
            else:
                result.set_result(value)

        row = self._submit(plan, deliver)
        try:
            return result.result()
        except BaseException:  # KeyboardInterrupt in a notebook cell: stop decoding this row
            if not result.done():
                self._abort_rows([row])
            raise

    def pause(self) -> None:
        """Stop decoding. Returns once no step is running; in-flight requests keep their state."""
        with self._cond:
            self._paused = True
            if threading.current_thread() is not self._thread:
                while self._in_step:
                    self._cond.wait()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)

    def rng_state(self) -> torch.Tensor:
        """The sampling generator's state (a checkpoint keeps it, so a resumed run samples on)."""
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._generator.set_state(state)

    def update_weights(
        self, weights: dict[str, torch.Tensor] | str | os.PathLike, version: int | None = None
    ) -> None:
        """Load new weights between two decoding steps; tokens sampled afterwards carry `version`.

        `weights` is a (possibly partial) state dict or a directory written by `save_pretrained`.
        Blocks until applied. Bad names or shapes raise WeightUpdateError and change nothing.
        """
        if isinstance(weights, (str, os.PathLike)):
            weights = read_weights_dir(weights)
        check_weights(self.model, weights)
        own = self.model.state_dict()
        staged = {k: v.detach().to(device=own[k].device, dtype=own[k].dtype) for k, v in weights.items()}
        update = _WeightUpdate(staged, None if version is None else int(version))
        if threading.current_thread() is self._thread:
            self._apply_update(update)
        else:
            with self._cond:
                if self._closed:
                    raise EngineClosedError("LocalEngine is closed; cannot update weights")
                self._updates.append(update)
                self._cond.notify_all()
            update.done.wait()
        if update.error is not None:
            raise update.error

    def abort(self, rid: str) -> None:
        """Finish every in-flight or waiting request with this rid: stop_reason "abort", partial output."""
        with self._cond:
            rows = [r for r in self._live if r.plan.rid == rid]
        self._abort_rows(rows)

    def abort_all(self) -> None:
        with self._cond:
            rows = list(self._live)
        self._abort_rows(rows)

    def close(self) -> None:
        """Stop the worker; requests still pending fail with EngineClosedError. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ submission

    def _plan(self, req: ModelRequest) -> RequestPlan:
        if self._closed:
            raise EngineClosedError("LocalEngine is closed")
        return plan_request(
            req,
            vocab_size=self.vocab_size,
            max_context=self.max_context,
            eos_token_ids=self.eos_token_ids,
            tokenizer=self.tokenizer,
        )

    def _submit(self, plan: RequestPlan, deliver: Delivery) -> _Row:
        row = _Row(plan=plan, deliver=deliver, submitted=time.perf_counter())
        if (
            plan.constraint is not None
        ):  # compiled in the caller's thread: a bad grammar never reaches the worker
            row.grammar = TokenGrammar(plan.constraint, self.tokenizer, self.vocab_size)
        sampling = plan.sampling
        row.masked = (
            row.grammar is not None
            or sampling.truncates(self.vocab_size)
            or (plan.min_new_tokens > 0 and not sampling.greedy)
        )
        with self._cond:
            if self._closed:
                raise EngineClosedError("LocalEngine is closed")
            self._waiting.append(row)
            self._live.add(row)
            self._cond.notify_all()
        return row

    def _abort_rows(self, rows: list[_Row]) -> None:
        if not rows:
            return
        with self._cond:
            for row in rows:
                row.aborted = True
            self._abort_pending = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ worker

    def _has_work(self) -> bool:
        return (
            self._closed
            or bool(self._updates)
            or self._abort_pending
            or (not self._paused and bool(self._active or self._waiting))
        )

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._has_work():
                        self._cond.wait()
                    if self._closed:
                        break
                    updates = list(self._updates)
                    self._updates.clear()
                    self._abort_pending = False
                    aborted_waiting = [r for r in self._waiting if r.aborted]
                    for r in aborted_waiting:
                        self._waiting.remove(r)
                    admitted: list[_Row] = []
                    if not self._paused:
                        while self._waiting and len(self._active) + len(admitted) < self.max_batch_size:
                            admitted.append(self._waiting.popleft())
                    self._in_step = not self._paused
                try:
                    for update in updates:
                        self._apply_update(update)
                    for row in aborted_waiting:
                        self._finish(row, "abort")
                    self._retire(abort_only=True)
                    if self._in_step:
                        self._step(admitted)
                except Exception as exc:  # never let the worker die: it serves every other request
                    self._errors.exception("LocalEngine worker iteration failed")
                    # The batch state is unknown now: fail its rows rather than retry the same
                    # failing step forever (every request gets an answer, the loop never spins).
                    self._fail_all(admitted, RuntimeError(f"LocalEngine step failed: {exc!r}"))
                finally:
                    with self._cond:
                        self._in_step = False
                        self._cond.notify_all()
        self._shutdown()

    def _apply_update(self, update: _WeightUpdate) -> None:
        try:
            copy_weights_into(self.model, update.weights)
            if update.version is not None:
                self._version = update.version
        except BaseException as exc:  # noqa: BLE001 - reported to the caller of update_weights
            update.error = exc
        finally:
            if self._batch.fast is not None:
                self._batch.fast.refresh()  # its fused projections copy the old weights
            # cached KV was computed by the old weights (even a failed copy may have changed some)
            self._epoch += 1
            self.prefix_cache.clear()
            update.done.set()

    def _step(self, admitted: list[_Row]) -> None:
        admitted = self._drop_aborted(admitted)
        if admitted:
            joined_running = any(r.output for r in self._active)
            try:
                logits = self._prefill(admitted)
            except Exception as exc:
                self.prefix_cache.clear()
                err = RuntimeError(f"LocalEngine prefill failed: {exc!r}")
                for row in admitted:
                    self._fail(row, err)
            else:
                self.stats.prefills += 1
                if joined_running:
                    self.stats.joined_running_batch += len(admitted)
                self._active.extend(admitted)
                self._sample_and_record(logits, admitted)
                self._retire()
        if not self._active:
            return
        last = torch.tensor([r.output[-1] for r in self._active], dtype=torch.long, device=self.device)
        with _torch_threads(self._small_work_threads(len(self._active))):
            try:
                logits = self._batch.decode(last)
            except Exception as exc:
                self.prefix_cache.clear()  # before any caller hears of the failure
                err = RuntimeError(f"LocalEngine decoding step failed: {exc!r}")
                for row in self._active:
                    self._fail(row, err)
                self._active = []
                self._batch.clear()
                return
            self.stats.decode_steps += 1
            self.stats.max_active = max(self.stats.max_active, len(self._active))
            self._sample_and_record(logits, self._active)
        self._retire()

    def _small_work_threads(self, rows: int) -> int | None:
        """1 for a decoding step of at most `single_thread_rows` rows, else None (unchanged)."""
        return 1 if rows <= self.single_thread_rows else None

    def _prefill(self, admitted: list[_Row]) -> torch.Tensor:
        """Prefill `admitted` into the batch, from the prefix cache where their prompts continue
        a cached sequence; return their next-token logits."""
        prefixes = []
        for row in admitted:
            row.epoch = self._epoch
            hit = self.prefix_cache.lookup(row.plan.prompt) if self.prefix_cache.enabled else None
            row.prefix = None if hit is None else hit.entry
            prefixes.append(None if hit is None else hit.kv)
            self.stats.prompt_tokens += len(row.plan.prompt)
            if hit is not None:
                self.stats.prefix_cache_hits += 1
                self.stats.prefix_cache_tokens += hit.length
        logits = self._batch.prefill([r.plan.prompt for r in admitted], prefixes)
        self.stats.prefill_positions += self._batch.last_prefill_computed
        return logits

    def _keep_prefixes(self, finished: list[tuple[int, _Row]]) -> None:
        """Put finished rows' keys/values (batch row, row) in the prefix cache (each row's prompt and
        every output token but the last, which was sampled, never fed) if the current weights
        computed them; one copy out of the batch for all of them."""
        if not self.prefix_cache.enabled:
            return
        kept = [(index, row) for index, row in finished if row.epoch == self._epoch and row.output]
        if not kept:
            return
        try:
            kvs = self._batch.rows_kv([index for index, _ in kept])
            for (_, row), kv in zip(kept, kvs, strict=True):
                self.prefix_cache.insert(list(row.plan.prompt) + row.output[:-1], kv, replaces=row.prefix)
        except Exception:  # a cache fault must not fail the request: it only loses the reuse
            self._errors.exception(
                "LocalEngine could not keep the prefixes of requests %s", [row.plan.rid for _, row in kept]
            )
            self.prefix_cache.clear()

    def _fail_all(self, admitted: list[_Row], error: BaseException) -> None:
        self.prefix_cache.clear()
        for row in {*self._active, *admitted}:
            if row in self._live:
                self._fail(row, error)
        self._active = []
        self._batch.clear()

    def _drop_aborted(self, rows: list[_Row]) -> list[_Row]:
        keep = []
        for row in rows:
            if row.aborted:
                self._finish(row, "abort")
            else:
                keep.append(row)
        return keep

    def _sample_and_record(self, logits: torch.Tensor, rows: list[_Row]) -> None:
        banned = None
        if any(r.plan.min_new_tokens for r in rows):
            banned = [
                sorted(r.plan.stop_token_ids) if len(r.output) < r.plan.min_new_tokens else [] for r in rows
            ]
        if any(r.masked for r in rows):
            self._sample_masked_and_record(logits, rows, banned)
            return
        try:
            tokens, logprobs = sample_next_tokens(
                logits, [r.plan.sampling for r in rows], self._generator, banned
            )
            picked = list(zip(tokens.tolist(), logprobs.tolist(), strict=True))
        except Exception:
            # A row whose sampling fails fails alone: sample row by row, the others go on.
            picked = [
                self._sample_one(logits[i : i + 1], row, None if banned is None else [banned[i]])
                for i, row in enumerate(rows)
            ]
        version = self._version
        now = time.perf_counter()
        for row, choice in zip(rows, picked, strict=True):
            if choice is None:
                continue  # failed: _retire takes it out of the batch
            token, logprob = choice
            row.output.append(token)
            row.logprobs.append(logprob)
            row.versions.append(version)
            if row.first_token_at is None:
                row.first_token_at = now
            row.stop_reason = self._stop_reason(row, token)
        self.stats.tokens += len(rows)

    def _sample_masked_and_record(
        self, logits: torch.Tensor, rows: list[_Row], banned: list[list[int]] | None
    ) -> None:
        """Sampling where some row is masked: grammar masks first, then what each row's
        distribution was is recorded with its token (`SamplingMasks`)."""
        try:
            allowed = [None if r.grammar is None else r.grammar.allowed() for r in rows]
            choice = sample_masked(logits, [r.plan.sampling for r in rows], self._generator, banned, allowed)
        except Exception as exc:  # a grammar fault fails these rows, not the engine
            self._errors.exception("LocalEngine could not sample under a mask")
            for row in rows:
                row.error = RuntimeError(f"LocalEngine masked sampling failed: {exc!r}")
            return
        version = self._version
        now = time.perf_counter()
        for i, (row, token, logprob, sampled) in enumerate(
            zip(
                rows,
                choice.tokens.tolist(),
                choice.logprobs.tolist(),
                choice.sampled_logprobs.tolist(),
                strict=True,
            )
        ):
            row.output.append(token)
            row.logprobs.append(logprob)
            row.versions.append(version)
            if row.masked:
                row.kept.append(choice.kept[i])
                row.sampled_logprobs.append(sampled)
            if row.first_token_at is None:
                row.first_token_at = now
            if row.grammar is not None and not row.grammar.advance(token):
                row.error = RuntimeError(
                    f"LocalEngine sampled token {token}, which its grammar did not allow"
                )
                continue
            row.stop_reason = self._stop_reason(row, token)
        self.stats.tokens += len(rows)

    def _sample_one(
        self, logits: torch.Tensor, row: _Row, banned: list[list[int]] | None
    ) -> tuple[int, float] | None:
        try:
            tokens, logprobs = sample_next_tokens(logits, [row.plan.sampling], self._generator, banned)
            return int(tokens[0]), float(logprobs[0])
        except Exception as exc:
            self._errors.exception("LocalEngine could not sample request %s", row.plan.rid)
            row.error = RuntimeError(f"LocalEngine sampling failed for this request: {exc!r}")
            return None

    def _stop_reason(self, row: _Row, token: int) -> str | None:
        plan = row.plan
        if token in plan.stop_token_ids:  # stop ids cannot be sampled before min_new_tokens
            return "stop"
        if plan.stop_strings:
            text = self.tokenizer.decode(row.output, skip_special_tokens=False)
            for stop in plan.stop_strings:
                # only occurrences that end in the newly decoded text: earlier ones were checked
                if stop in text[max(0, row.checked_text_len - len(stop) + 1) :]:
                    return "stop"
            row.checked_text_len = len(text)
        if len(row.output) >= plan.max_new_tokens:
            return "length"
        return None

    def _retire(self, abort_only: bool = False) -> None:
        """Finish rows that stopped (or were aborted) and drop them from the batch."""
        keep: list[int] = []
        finished: list[tuple[int, _Row]] = []
        for index, row in enumerate(self._active):
            if row.error is not None:
                self._fail(row, row.error)
                continue
            if row.aborted and row.stop_reason is None:
                row.stop_reason = "abort"
            if row.stop_reason is None or (abort_only and row.stop_reason != "abort"):
                keep.append(index)
            else:
                finished.append((index, row))
        self._keep_prefixes([(index, row) for index, row in finished if row.stop_reason != "abort"])
        for _, row in finished:
            self._finish(row, row.stop_reason)
        if len(keep) != len(self._active):
            keep = compact_order(keep)  # the rows after the freed slots move into them
            self._batch.keep_rows(keep)
            self._active = [self._active[i] for i in keep]

    def _finish(self, row: _Row, stop_reason: str) -> None:
        now = time.perf_counter()
        response = ModelResponse(
            input_tokens=list(row.plan.prompt),
            output_tokens=list(row.output),
            output_logprobs=list(row.logprobs),
            output_versions=list(row.versions),
            stop_reason=stop_reason,
            latency=now - row.submitted,
            ttft=(row.first_token_at or now) - row.submitted,
            tokenizer=self.tokenizer,
            eos_token_ids=list(self.eos_token_ids),
            sampling_masks=SamplingMasks(row.plan.constraint, list(row.kept), list(row.sampled_logprobs))
            if row.masked
            else None,
        )
        self._deliver(row, response)

    def _fail(self, row: _Row, error: BaseException) -> None:
        self._deliver(row, error)

    def _deliver(self, row: _Row, value: ModelResponse | BaseException) -> None:
        with self._cond:
            self._live.discard(row)
        try:
            row.deliver(value)
        except Exception:  # a broken callback must not take the worker down
            logger.exception("LocalEngine could not deliver the result of request %s", row.plan.rid)

    def _shutdown(self) -> None:
        with self._cond:
            rows = list(self._live)
            self._waiting.clear()
            updates = list(self._updates)
            self._updates.clear()
        error = EngineClosedError("LocalEngine was closed before the request finished")
        for row in rows:
            self._fail(row, error)
        for update in updates:
            update.error = EngineClosedError("LocalEngine was closed before the weight update was applied")
            update.done.set()
        self._active = []
        self._batch.clear()
        self.prefix_cache.clear()

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
import os
import threading
import time
from collections import deque
from typing import Any

import torch
from transformers import PreTrainedModel

from areal_nb.api import InferenceEngine, InPlaceAdapters, ModelRequest, ModelResponse
from areal_nb.api.constraints import TokenGrammar
from areal_nb.errors import (
    CallOrderError,
    EngineClosedError,
    InvalidArgumentError,
    ModelFileError,
)

from .defaults import DEFAULT_MAX_BATCH_SIZE, DEFAULT_PREFIX_CACHE_TOKENS, DEFAULT_SINGLE_THREAD_ROWS
from .in_place_lora import AdapterHooks, check_in_place_adapters
from .kv_batch import PaddedKVBatch
from .local_state import Delivery, EngineStats, RateLimitedLog, Row, WeightUpdate
from .local_worker import EngineWorker, small_step_rows
from .prefix_cache import PrefixCache
from .request_plan import RequestPlan, plan_request
from .sampling import VocabScratch
from .weights import can_share_weights, check_weights, load_engine_model, read_weights_dir

__all__ = ["EngineClosedError", "EngineStats", "LocalEngine"]


class LocalEngine(EngineWorker, InferenceEngine):
    """In-process engine; see the module docstring. Its worker loop is `local_worker.EngineWorker`,
    its sampling `local_sampling.RowSampling`."""

    max_context: int  # the model's, always known

    # capabilities (`InferenceEngine`): max_context, stats and shares_weights are set per instance
    # a LoRA policy comes as base + ΔW merged into full weights, or, sharing the trainer's
    # weights, as its adapter tensors themselves (`InPlaceAdapters`), not as peft's saved adapter
    serves_lora_adapters = False
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
        thread, fewer for models wider than tiny ones (`single_thread_limit`; see the comment on
        `DEFAULT_SINGLE_THREAD_ROWS` in `local_worker`; 0: never); `prefix_cache_tokens` bounds the prefix cache
        (tokens of KV kept, 0: no cache).

        `share_weights=True`, for a loaded `model` whose parameters already are `dtype` tensors on
        `device`: serve those tensors themselves, no copy (`shares_weights` says whether it
        does). Whoever changes them in place (a trainer's optimizer step) must do so while the
        engine is paused and then `update_weights` with them (no copy: a version change between
        two decoding steps), so every token carries the version of the weights that sampled it.
        A LoRA trainer's model (peft injects its layers into it after this copy of the modules):
        the engine runs the frozen base, and `update_weights(InPlaceAdapters)` gives it the
        adapter tensors themselves, under the same rule (`in_place_lora`)."""
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
        self.single_thread_limit = small_step_rows(self.model.config, self.single_thread_rows)
        self.max_context = int(self.model.config.max_position_embeddings)
        self.vocab_size = _vocabulary_rows(self.model)
        self.eos_token_ids = self._eos_ids()
        self.stats = EngineStats()

        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._scratch = VocabScratch()  # the sampling's [rows, V] buffers, kept while rows run; worker-only
        self._version = 0
        self._batch = PaddedKVBatch(self.model, fast_forward=fast_forward, max_rows=max_batch_size)
        self._adapter_hooks = AdapterHooks()  # the stock forward's LoRA served in place; worker-only
        self._active: list[Row] = []  # aligned with the rows of self._batch; worker-only
        self.prefix_cache = PrefixCache(prefix_cache_tokens)  # worker-only
        self._epoch = 0  # +1 on every weight update: KV of an older epoch is not kept

        self._cond = threading.Condition()
        self._waiting: deque[Row] = deque()
        self._live: set[Row] = set()  # every submitted, unfinished row
        self._updates: deque[WeightUpdate] = deque()
        self._abort_pending = False
        self._paused = False
        self._closed = False
        self._in_step = False
        self._errors = RateLimitedLog()
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

    def drop_caches(self) -> None:
        """Free, if no request is running or waiting, what the engine keeps only to be faster: its
        lean forward's copies of the weights (fused and prepacked: about the model's size again;
        not those of a frozen base whose LoRA adapters it serves in place, which stay valid)
        and the prefix cache. Both are rebuilt as requests come; a weight update drops them anyway,
        so a trainer calls this before a step whose update will follow, and its forwards and
        backwards get that memory. Busy, it does nothing."""
        with self._cond:  # (the worker takes work under the lock: no step starts meanwhile)
            while self._in_step and threading.current_thread() is not self._thread:
                self._cond.wait()  # (a step that delivered the last reply may still be ending)
            if self._closed or self._in_step or self._active or self._waiting or self._updates:
                return
            fast = self._batch.fast
            if fast is not None and not fast.adapters:  # (LoRA in place: copies of a frozen base, kept)
                fast.refresh()
            self.prefix_cache.clear()

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
        self,
        weights: dict[str, torch.Tensor] | str | os.PathLike | InPlaceAdapters,
        version: int | None = None,
    ) -> None:
        """Load new weights between two decoding steps; tokens sampled afterwards carry `version`.

        `weights` is a (possibly partial) state dict or a directory written by `save_pretrained`;
        or, for an engine that shares the trainer's weights, the trainer's LoRA adapter tensors
        themselves (`InPlaceAdapters`: served as base + scaling·B(A(x)), no merged copy; see
        `in_place_lora`). Blocks until applied. Bad names or shapes raise WeightUpdateError and
        change nothing.
        """
        version = None if version is None else int(version)
        if isinstance(weights, InPlaceAdapters):
            fast = self._batch.fast
            covered = None if fast is None else fast.projection_modules()
            check_in_place_adapters(self.model, weights, self.shares_weights, covered)
            update = WeightUpdate({}, version, adapters=dict(weights.modules))
        else:
            if isinstance(weights, (str, os.PathLike)):
                weights = read_weights_dir(weights)
            check_weights(self.model, weights)
            own = self.model.state_dict()
            staged = {k: v.detach().to(device=own[k].device, dtype=own[k].dtype) for k, v in weights.items()}
            update = WeightUpdate(staged, version)
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

    def _submit(self, plan: RequestPlan, deliver: Delivery) -> Row:
        row = Row(plan=plan, deliver=deliver, submitted=time.perf_counter())
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

    def _abort_rows(self, rows: list[Row]) -> None:
        if not rows:
            return
        with self._cond:
            for row in rows:
                row.aborted = True
            self._abort_pending = True
            self._cond.notify_all()


def _vocabulary_rows(model: PreTrainedModel) -> int:
    """Rows of the model's input embedding matrix (the token ids it accepts)."""
    weight = model.get_input_embeddings().weight
    if not isinstance(weight, torch.Tensor):
        raise ModelFileError(f"the model's input embeddings hold no weight tensor ({type(weight).__name__})")
    return int(weight.shape[0])

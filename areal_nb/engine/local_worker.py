"""`LocalEngine`'s worker: the scheduler loop that owns the model (see `local`'s module docstring).

Each iteration applies pending weight updates and aborts, admits waiting rows into the batch (one
prefill, from the prefix cache where their prompts continue a cached sequence), runs one decoding
step over every active row, and retires the rows that finished (their keys/values go to the prefix
cache when the current weights computed them). Any failure fails the rows it touched, never the
worker: it serves every other request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from areal_nb.api import ModelResponse, SamplingMasks
from areal_nb.errors import EngineClosedError

from .in_place_lora import AdapterHooks
from .kv_batch import PaddedKVBatch, compact_order
from .local_sampling import RowSampling
from .local_state import Row, WeightUpdate, logger
from .prefix_cache import PrefixCache
from .weights import copy_weights_into

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
#
# What makes a step small is the size of its matmuls, not its rows alone: the rows cap holds for
# models up to that Qwen2's width, and a wider model's steps count as small only while their
# widest matmul (rows x hidden x MLP width multiply-adds) stays under the one of its 64 rows.
# SmolLM2-135M (576 x 1,536) crosses it at 18 rows: a GRPO step's rollout of 32 rows on one thread
# took 5.5-5.7 s, on both threads 4.1-4.3 s (the Session with its agents beside it, 4 steps each
# way, quiet machine; `engine.single_thread_rows=0` against the cap of 64 rows).
SMALL_STEP_MACS = 64 * 256 * 1024


def small_step_rows(config: object, cap: int) -> int:
    """The most rows a decoding step of a model with this config may have to run on one thread:
    `cap` (`single_thread_rows`), lowered for models wider than the measured one."""
    hidden = getattr(config, "hidden_size", None)  # (HF configs name these per family; a
    width = getattr(config, "intermediate_size", None)  # model without them keeps the cap)
    if not isinstance(hidden, int) or not isinstance(width, int) or hidden * width <= 0:
        return cap
    return min(cap, SMALL_STEP_MACS // (hidden * width))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
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


class EngineWorker(RowSampling):
    """`LocalEngine`'s worker thread (a base of `LocalEngine`, which creates the state below and
    starts `_run`). Attributes marked worker-only there are touched by this thread alone; the
    queues and flags are shared under `_cond`."""

    device: torch.device
    model: PreTrainedModel
    max_batch_size: int
    single_thread_rows: int
    single_thread_limit: int
    eos_token_ids: list[int]
    prefix_cache: PrefixCache
    _batch: PaddedKVBatch
    _adapter_hooks: AdapterHooks
    _active: list[Row]
    _epoch: int
    _cond: threading.Condition
    _waiting: deque[Row]
    _live: set[Row]
    _updates: deque[WeightUpdate]
    _abort_pending: bool
    _paused: bool
    _closed: bool
    _in_step: bool

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
                    admitted: list[Row] = []
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

    def _apply_update(self, update: WeightUpdate) -> None:
        fast = self._batch.fast
        try:
            if update.adapters is not None:  # LoRA in place: the base is unchanged (frozen)
                self._adapter_hooks.attach(self.model, update.adapters)
                if fast is not None:
                    fast.set_adapters(update.adapters)
            else:
                copy_weights_into(self.model, update.weights)
            if update.version is not None:
                self._version = update.version
        except BaseException as exc:  # noqa: BLE001 - reported to the caller of update_weights
            update.error = exc
        finally:
            if fast is not None and update.adapters is None:
                fast.refresh()  # its fused projections copy the old weights
            # cached KV was computed by the old weights (even a failed copy may have changed some)
            self._epoch += 1
            self.prefix_cache.clear()
            update.done.set()

    def _step(self, admitted: list[Row]) -> None:
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
            self._scratch.clear()  # the batch ran dry: no sampling buffers held while idle
            return
        last = torch.tensor([r.output[-1] for r in self._active], dtype=torch.long, device=self.device)
        with torch_threads(self._small_work_threads(len(self._active))):
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
        if not self._active:
            self._scratch.clear()

    def _small_work_threads(self, rows: int) -> int | None:
        """1 for a small decoding step (at most `single_thread_limit` rows), else None (unchanged)."""
        return 1 if rows <= self.single_thread_limit else None

    def _prefill(self, admitted: list[Row]) -> torch.Tensor:
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

    def _keep_prefixes(self, finished: list[tuple[int, Row]]) -> None:
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

    def _fail_all(self, admitted: list[Row], error: BaseException) -> None:
        self.prefix_cache.clear()
        for row in {*self._active, *admitted}:
            if row in self._live:
                self._fail(row, error)
        self._active = []
        self._batch.clear()

    def _drop_aborted(self, rows: list[Row]) -> list[Row]:
        keep = []
        for row in rows:
            if row.aborted:
                self._finish(row, "abort")
            else:
                keep.append(row)
        return keep

    def _retire(self, abort_only: bool = False) -> None:
        """Finish rows that stopped (or were aborted) and drop them from the batch."""
        keep: list[int] = []
        finished: list[tuple[int, Row, str]] = []  # batch row, row, stop reason
        for index, row in enumerate(self._active):
            if row.error is not None:
                self._fail(row, row.error)
                continue
            if row.aborted and row.stop_reason is None:
                row.stop_reason = "abort"
            reason = row.stop_reason
            if reason is None or (abort_only and reason != "abort"):
                keep.append(index)
            else:
                finished.append((index, row, reason))
        self._keep_prefixes([(index, row) for index, row, reason in finished if reason != "abort"])
        for _, row, reason in finished:
            self._finish(row, reason)
        if len(keep) != len(self._active):
            keep = compact_order(keep)  # the rows after the freed slots move into them
            self._batch.keep_rows(keep)
            self._active = [self._active[i] for i in keep]

    def _finish(self, row: Row, stop_reason: str) -> None:
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

    def _fail(self, row: Row, error: BaseException) -> None:
        self._deliver(row, error)

    def _deliver(self, row: Row, value: ModelResponse | BaseException) -> None:
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
        self._scratch.clear()
        self.prefix_cache.clear()

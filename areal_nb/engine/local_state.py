"""What `LocalEngine` keeps per request (`Row`), per pending weight update (`WeightUpdate`) and in
total (`EngineStats`), and its rate-limited error log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_nb.api import LowRankAdapter, ModelResponse
from areal_nb.api.constraints import TokenGrammar

from .prefix_cache import CachedPrefix
from .request_plan import RequestPlan

# one logger for the whole engine, whichever of its modules logs
logger = logging.getLogger("areal_nb.engine.local")

Delivery = Callable[[ModelResponse | BaseException], None]


class RateLimitedLog:
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
class Row:
    """One request, from submission until its answer is delivered."""

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
class WeightUpdate:
    weights: dict[str, torch.Tensor]
    version: int | None
    # a LoRA policy served in place (`in_place_lora`): the adapters by module name (`weights` empty)
    adapters: dict[str, LowRankAdapter] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

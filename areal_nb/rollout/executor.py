"""RolloutExecutor: runs episodes (one asyncio task per prompt × sample) under staleness control.

Groups (the `group_size` samples of one prompt) start together and are handed out in
submission order, so the staleness bound of `StalenessManager` holds for every trained token.
An episode that raises, times out, or returns nothing is *rejected*: it is counted, its reason
kept, and training goes on without it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from areal_nb.api import InferenceEngine, RolloutWorkflow
from areal_nb.api.deadline import CANCEL_GRACE_S, TaskAbandoned, run_within
from areal_nb.errors import (
    InvalidArgumentError,
    StalenessLimitError,  # noqa: F401 (re-exported)
)

from .staleness import StalenessManager
from .switch_interval import SwitchIntervalLease

logger = logging.getLogger(__name__)


def _rejection_with_row(ep: Episode, describe_row: Callable[[dict], str | None]) -> str:
    """`ep`'s rejection reason, prefixed with its row when `describe_row` can name it."""
    try:
        row = describe_row(ep.data)
    except Exception:  # naming the row is a courtesy; it must never lose the reason
        row = None
    return f"{row}: {ep.rejection_reason}" if row else str(ep.rejection_reason)


@dataclass
class Episode:
    data: dict
    group_id: int
    sample_id: int
    version_submitted: int
    interactions: dict | None = None  # {interaction_id: InteractionWithTokenLogpReward}
    rejection_reason: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    @property
    def accepted(self) -> bool:
        return self.interactions is not None and self.rejection_reason is None


@dataclass
class _Group:
    group_id: int
    data: dict
    episodes: list[Episode] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    started: bool = False
    # Asked for explicitly (a notebook's `rollout()`): generated now, at the current version, and
    # handed out at once, so only the concurrency limit applies, not the staleness budget.
    explicit: bool = False

    @property
    def done(self) -> bool:
        return self.started and all(t.done() for t in self.tasks)


class RolloutExecutor:
    """Must be used from one asyncio loop (the Session's background loop)."""

    def __init__(
        self,
        workflow: RolloutWorkflow,
        engine: InferenceEngine,
        *,
        group_size: int,
        batch_size: int,
        max_head_offpolicyness: int,
        max_concurrent: int,
        episode_timeout: float | None = None,
        switch_interval: float | None = None,
    ) -> None:
        """`switch_interval`: the GIL switch interval (seconds) while episodes are in flight
        (`rollout.gil_switch_interval`, see `switch_interval.py`); None leaves it alone."""
        if max_concurrent < group_size:
            raise InvalidArgumentError(
                f"max_concurrent_rollouts ({max_concurrent}) must be >= group_size ({group_size}): "
                "a group starts all its samples together"
            )
        self.workflow = workflow
        self.engine = engine
        self.group_size = group_size
        self.episode_timeout = episode_timeout
        self.staleness = StalenessManager(max_concurrent, max_head_offpolicyness, batch_size * group_size)
        self._groups: deque[_Group] = deque()  # submitted (started or waiting), FIFO
        self._next_group_id = 0
        self._changed = asyncio.Event()
        self._feeder: Iterator[dict] | None = None
        self._feeder_error: Exception | None = None  # raised by the next wait_groups
        self.rejection_reasons: list[str] = []
        # Names an episode's row in rejection messages ("data.source row 5"); the Session sets it.
        self.describe_row: Callable[[dict], str | None] = lambda data: None
        # Held exactly while episodes run: acquired by _start, released when the last one ends.
        self._switch_interval = SwitchIntervalLease(switch_interval)

    # ------------------------------------------------------------------ submission

    def submit(self, data: dict, explicit: bool = True) -> int:
        group = _Group(self._next_group_id, data, explicit=explicit)
        self._next_group_id += 1
        self._groups.append(group)
        self._pump()
        return group.group_id

    def set_feeder(self, feeder: Iterator[dict] | None) -> None:
        """With a feeder, new groups are started whenever the staleness bound allows (async RL)."""
        self._feeder = feeder
        self._pump()

    def _pump(self) -> None:
        version = self.engine.get_version()
        for group in self._groups:
            if group.started:
                continue
            free = self.staleness.max_concurrent - self.staleness.running
            if free < self.group_size or (
                not group.explicit and self.staleness.capacity(version) < self.group_size
            ):
                return
            self._start(group, version)
        while self._feeder is not None and self.staleness.capacity(version) >= self.group_size:
            try:
                data = next(self._feeder)
            except StopIteration:
                self._feeder = None
                return
            group = _Group(self._next_group_id, data)
            self._next_group_id += 1
            self._groups.append(group)
            self._start(group, version)

    def _pump_quietly(self) -> None:
        """`_pump` from a finishing episode: the feeder's error must not break that episode's
        bookkeeping; it stops the feeder and is raised to the caller of the next `wait_groups`."""
        try:
            self._pump()
        except Exception as exc:
            self._feeder, self._feeder_error = None, exc

    def _start(self, group: _Group, version: int) -> None:
        group.started = True
        self.staleness.on_submit(self.group_size)
        self._switch_interval.acquire()
        for i in range(self.group_size):
            ep = Episode(data=group.data, group_id=group.group_id, sample_id=i, version_submitted=version)
            group.episodes.append(ep)
            group.tasks.append(asyncio.ensure_future(self._run_episode(ep)))

    async def _run_episode(self, ep: Episode) -> None:
        accepted = False
        try:
            coro = self.workflow.arun_episode(self.engine, copy.deepcopy(ep.data))
            # (not asyncio.wait_for: an episode that swallows its cancellation is abandoned, not waited for)
            result = await run_within(
                coro, self.episode_timeout, what=f"episode (group {ep.group_id}, sample {ep.sample_id})"
            )
            if result is None:
                reason = getattr(self.workflow, "last_rejection_reason", None) or "workflow returned None"
                ep.rejection_reason = str(reason)
            elif not isinstance(result, dict) or not result:
                ep.rejection_reason = f"episode produced no interactions ({type(result).__name__})"
            else:
                ep.interactions = result
                accepted = True
        except asyncio.CancelledError:
            ep.rejection_reason = "cancelled"
            raise
        except TimeoutError:
            ep.rejection_reason = f"episode timed out after {self.episode_timeout} s"
        except TaskAbandoned as e:
            ep.rejection_reason = str(e)
        except Exception as e:  # an agent bug must never stop training
            ep.rejection_reason = f"{type(e).__name__}: {e}"
        finally:
            ep.finished_at = time.time()
            if ep.rejection_reason != "cancelled":
                self.staleness.on_finish(accepted)
                if not accepted:
                    reason = _rejection_with_row(ep, self.describe_row)
                    self.rejection_reasons.append(reason)
                    logger.warning(
                        "episode rejected (group %d, sample %d): %s", ep.group_id, ep.sample_id, reason
                    )
            if self.staleness.running <= 0:
                self._switch_interval.release()
            self._changed.set()
            if self._feeder is not None and ep.rejection_reason != "cancelled":
                self._pump_quietly()  # async RL: a freed slot starts the next group now, not at the next step

    # ------------------------------------------------------------------ consumption

    @property
    def n_waiting(self) -> int:
        return len(self._groups)

    def on_version_change(self) -> None:
        """Call after the engine's version moved: more rollouts may start now."""
        self._pump()

    async def wait_groups(self, n: int) -> list[list[Episode]]:
        """The `n` oldest groups, once every episode in them has finished."""
        if n > len(self._groups) and self._feeder is None:
            raise InvalidArgumentError(f"asked for {n} groups but only {len(self._groups)} were submitted")
        while True:
            if self._feeder_error is not None:
                error, self._feeder_error = self._feeder_error, None
                raise error
            self._pump()
            if len(self._groups) >= n and all(g.done for g in list(self._groups)[:n]):
                if self._restart_stale(n):
                    continue
                out = [self._groups.popleft().episodes for _ in range(n)]
                self.staleness.on_hand_out(sum(len(g) for g in out), self.engine.get_version())
                return out
            head = list(self._groups)[:n]
            if self.staleness.running == 0 and len(head) < n and self._feeder is None:
                raise InvalidArgumentError(f"asked for {n} groups but the data ran out after {len(head)}")
            if self.staleness.running == 0 and (any(not g.started for g in head) or len(head) < n):
                raise StalenessLimitError(
                    "these rollouts would exceed rollout.max_head_offpolicyness="
                    f"{self.staleness.max_staleness} at policy version {self.engine.get_version()}: "
                    "train on the batches you have first (session.train_step) or raise the limit"
                )
            self._changed.clear()
            await self._changed.wait()

    def _restart_stale(self, n: int) -> bool:
        """Start again, at the current version, the prefetched groups among the `n` oldest that
        the bound no longer allows to train (handed out later than the budget assumed: a notebook
        training fewer than B episodes per step after `run()` prefetched): the guarantee holds
        however the Session is driven. Explicit groups (`rollout(rows)`) are the caller's own."""
        version = self.engine.get_version()
        restarted = 0
        for i, group in enumerate(list(self._groups)[:n]):
            if group.explicit or not self.staleness.is_too_stale(
                group.episodes[0].version_submitted, version
            ):
                continue
            self.staleness.on_cancel(0, len(group.episodes))
            self._groups[i] = _Group(self._next_group_id, group.data, explicit=False)
            self._next_group_id += 1
            restarted += 1
        if restarted:
            logger.warning(
                "%d prefetched group(s) sampled more than max_head_offpolicyness=%d versions before "
                "version %d were generated again",
                restarted,
                self.staleness.max_staleness,
                version,
            )
        return restarted > 0

    async def cancel_all(self) -> None:
        """Cancel running episodes and forget waiting groups (KeyboardInterrupt in a cell)."""
        self._feeder = None
        tasks = [t for g in self._groups for t in g.tasks if not t.done()]
        running = len(tasks)
        finished = sum(len(g.tasks) for g in self._groups) - running
        for t in tasks:
            t.cancel()
        if tasks:  # each bounds its own clean-up (run_within); this bound is a second guard
            _, stuck = await asyncio.wait(tasks, timeout=2 * CANCEL_GRACE_S + 15)
            if stuck:
                logger.warning("%d episode(s) did not stop after cancellation; abandoned", len(stuck))
        self.staleness.on_cancel(running, finished)
        self._groups.clear()
        self._switch_interval.release()
        self._changed.set()

    def release_switch_interval(self) -> None:
        """Give the GIL switch interval back now (closing; callable from any thread)."""
        self._switch_interval.release()

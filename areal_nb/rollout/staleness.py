"""Staleness control: how many episodes may start now without breaking the staleness bound.

The guarantee (AReaL's `max_head_offpolicyness` S): every trained token was sampled at most S
policy versions before the version that trains it. Batches are handed out in submission order,
B episodes (`consumer_batch_size`) per training step, and every training step moves the version
by one. An episode that starts now at version v joins the queue behind the `queued` episodes
already started and not yet handed out, so it is trained `queued // B` steps after the next
one; the next step trains at v, or at v + k if k handed-out batches still wait for their step.
Hence the bound holds while

    queued + in_training < (S + 1)·B        (in_training: episodes of those k batches)

and at most `max_concurrent` episodes run at once.

AReaL writes the same bound as (S + v + 1)·B − (accepted + running), which equals it only if
every version from 0 to v consumed exactly B accepted episodes. Here three things break that
assumption, and the budget above counts what is really queued instead: a rejected episode still
fills its slot of a handed-out batch (groups are handed out whole); a Session resumed from a
checkpoint, or engine servers that already served updates, start at v > 0 with nothing
accepted (AReaL's "capacity inflation after recovery"); and a notebook's `rollout(n)` may train
on fewer than B episodes per version.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class StalenessManager:
    max_concurrent: int
    max_staleness: int
    consumer_batch_size: int
    running: int = 0
    accepted: int = 0  # accepted episodes, for the stats (the budget counts `queued`)
    rejected: int = 0
    queued: int = 0  # started and not yet handed out: running, or finished and waiting
    # episodes of the batches handed out for training since the last version step (their step
    # has not happened yet), and the version they were counted against
    in_training: deque[int] = field(default_factory=deque)
    version: int | None = None

    def capacity(self, version: int) -> int:
        """How many more episodes may start at `version` (can be negative)."""
        self._advance(version)
        concurrency = max(1, self.max_concurrent) - self.running
        budget = (self.max_staleness + 1) * max(1, self.consumer_batch_size)
        return min(concurrency, budget - self.queued - sum(self.in_training))

    def on_submit(self, n: int = 1) -> None:
        self.running += n
        self.queued += n

    def on_finish(self, accepted: bool) -> None:
        self.running -= 1
        if accepted:
            self.accepted += 1
        else:
            self.rejected += 1

    def on_hand_out(self, n: int, version: int) -> None:
        """`n` finished episodes left the queue as a training batch at `version`."""
        self._advance(version)
        self.queued -= n
        self.in_training.append(n)

    def on_discard(self, n: int) -> None:
        """The latest handed-out batch (`n` episodes) will not be trained (every episode rejected):
        it no longer waits for a training step."""
        if self.in_training and self.in_training[-1] == n:
            self.in_training.pop()

    def on_cancel(self, running: int, finished: int = 0) -> None:
        """Episodes dropped before being handed out give their budget back: `running` ones
        cancelled, `finished` ones discarded."""
        self.running -= running
        self.queued -= running + finished

    def _advance(self, version: int) -> None:
        """A version step ends the wait of every batch handed out before it: trained, or (a batch
        a notebook only looked at) never to be. Counting one batch per step instead leaked the
        budget of each untrained batch for good (with S = 0 no prefetched group could start: a
        hang). A batch handed out earlier but trained later than this step is not counted any
        more; the executor's hand-out check (`is_too_stale`) keeps the bound in that case."""
        if self.version is not None and version > self.version:
            self.in_training.clear()
        self.version = version

    def is_too_stale(self, version_submitted: int, version: int) -> bool:
        """Would an episode started at `version_submitted` break the bound if trained at `version`?"""
        return version - version_submitted > self.max_staleness

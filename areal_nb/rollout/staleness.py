"""Staleness control: how many episodes may be in flight or waiting for a given policy version.

The bound (AReaL's, reference §5.5): with consumer batch size B episodes per training step,
maximum head off-policyness S and current version v, at most (S + v + 1)·B episodes may have been
accepted or be running, and at most `max_concurrent` may run at once. Consuming batches in
submission order then guarantees that every trained token was sampled at most S versions ago.
Rejected episodes do not use the budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StalenessManager:
    max_concurrent: int
    max_staleness: int
    consumer_batch_size: int
    running: int = 0
    accepted: int = 0
    rejected: int = 0

    def capacity(self, version: int) -> int:
        concurrency = max(1, self.max_concurrent) - self.running
        staleness = (self.max_staleness + version + 1) * max(1, self.consumer_batch_size) - (
            self.accepted + self.running
        )
        return min(concurrency, staleness)

    def on_submit(self, n: int = 1) -> None:
        self.running += n

    def on_finish(self, accepted: bool) -> None:
        self.running -= 1
        if accepted:
            self.accepted += 1
        else:
            self.rejected += 1

    def on_cancel(self, n: int = 1) -> None:
        """Episodes cancelled before finishing give their budget back."""
        self.running -= n

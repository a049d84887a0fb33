"""A batch in which every episode was rejected: not trained on, rolled out again, and — when it
keeps happening — one error that says why, row by row.

Some bad rows (a key missing, a reward that raises on odd input) only reject their own episodes:
a batch trains on the rest. With small batches every prompt of one batch can be a bad row; that
batch has nothing to train on, so `Session.step()` (and `run()`) draws another one instead of
failing the run. `MAX_EMPTY_BATCHES` wholly rejected batches in a row mean the failure is not the
odd row but the task (the engine gone, every row lacking a key): `RolloutRejectedError` then lists
each distinct reason with the rows it hit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_nb.errors import RolloutRejectedError  # noqa: F401 (re-exported)

MAX_EMPTY_BATCHES = 5


def rejection_summary(batches: list[Any], source_index: Callable[[dict], int | None]) -> str:
    """Each distinct rejection reason of `batches`' episodes, with how often and on which rows."""
    rows_by_reason: dict[str, set[int]] = {}
    count: dict[str, int] = {}
    for batch in batches:
        for ep in batch.rejected:
            reason = str(ep.rejection_reason)
            count[reason] = count.get(reason, 0) + 1
            index = source_index(ep.data)
            rows = rows_by_reason.setdefault(reason, set())
            if index is not None:
                rows.add(index)
    lines = []
    for reason in sorted(count, key=lambda r: count[r], reverse=True):
        hit = sorted(rows_by_reason[reason])
        where = (
            f" — data.source row{'s' if len(hit) > 1 else ''} {', '.join(map(str, hit[:20]))}" if hit else ""
        )
        more = f" and {len(hit) - 20} more" if len(hit) > 20 else ""
        lines.append(f"  {count[reason]}× {reason}{where}{more}")
    return "\n".join(lines)


def empty_batch_message(batches: list[Any], source_index: Callable[[dict], int | None]) -> str:
    episodes = sum(len(b.episodes) for b in batches)
    return (
        f"every episode of the last {len(batches)} rollout batch(es) was rejected ({episodes} episodes), "
        f"so there is nothing to train on:\n{rejection_summary(batches, source_index)}"
    )


def rollout_until_accepted(
    rollout: Callable[[], Any],
    discard: Callable[[Any], None],
    source_index: Callable[[dict], int | None],
    logger: Any,
) -> Any:
    """`rollout()` until a batch has an accepted episode (None: a rank ≠ 0, which trains on rank 0's
    batch); `discard(batch)` for each wholly rejected one (it stops holding staleness budget);
    `RolloutRejectedError` after `MAX_EMPTY_BATCHES` of them in a row."""
    empty: list[Any] = []
    while True:
        batch = rollout()
        if batch is None or batch.accepted:
            return batch
        empty.append(batch)
        discard(batch)
        message = empty_batch_message(empty, source_index)
        if len(empty) >= MAX_EMPTY_BATCHES:
            raise RolloutRejectedError(message)
        logger.warning(
            "%s\nrolling out another batch (%d of at most %d)", message, len(empty) + 1, MAX_EMPTY_BATCHES
        )

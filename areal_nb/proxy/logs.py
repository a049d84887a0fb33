"""`RepeatFilter`: a failure that repeats on every request is logged once per interval.

When the engine fails for everyone (out of memory, a dead device), each request still gets its
500, but the log gets one traceback per kind of failure every `interval` seconds, with a count
of the records left out — not one per request.
"""

from __future__ import annotations

import logging
import threading
import time


class RepeatFilter(logging.Filter):
    """Passes the first record of a kind (logger, message template, exception type), then at
    most one per `interval` seconds, noting how many were left out in between."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._lock = threading.Lock()
        self._seen: dict[tuple, tuple[float, int]] = {}  # kind → (last passed at, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.msg, record.exc_info[0] if record.exc_info else None)
        now = time.monotonic()
        with self._lock:
            last, left_out = self._seen.get(kind, (-float("inf"), 0))
            if now - last < self.interval:
                self._seen[kind] = (last, left_out + 1)
                return False
            self._seen[kind] = (now, 0)
        if left_out:
            record.msg = f"{record.msg} ({left_out} similar records left out in the last {self.interval:g} s)"
        return True

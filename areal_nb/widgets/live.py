"""Polling refresher: re-read a source every ~0.4 s and re-render only when its key changed.

Polling keeps widgets decoupled from the capture and training layers (no hooks needed there);
the key is cheap (counts, flags and rewards), so an idle view costs almost nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class Refresher:
    def __init__(self, key: Callable[[], Any], render: Callable[[], None], interval: float = 0.4) -> None:
        self._key = key
        self._render = render
        self.interval = interval
        self._last: Any = object()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.last_error: BaseException | None = None

    def refresh(self, force: bool = False) -> bool:
        """Re-render if the source changed (or `force`); returns whether it re-rendered."""
        with self._lock:
            key = self._key()
            if not force and key == self._last:
                return False
            self._last = key
            self._render()
            return True

    def start(self) -> Refresher:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="areal_nb-widget-refresh", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval + 1)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
                self.last_error = None
            except Exception as e:  # keep polling: the data may be mid-update; show the error once
                if repr(e) != repr(self.last_error):
                    logger.warning("live widget refresh failed: %r", e)
                self.last_error = e

"""`EngineLog`: the engine servers' log lines, kept in memory and shown in a notebook.

The launcher calls `append(server_index, line)` from its log-pump threads; `widget()` is a
read-only ipywidgets Textarea holding the last `max_lines` lines, updated as lines arrive
(the full logs are in the run directory's `engine_logs/server-<i>.log`).
"""

from __future__ import annotations

import collections
import threading
from typing import Any


class EngineLog:
    def __init__(self, max_lines: int = 500) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._view: Any = None

    def append(self, server_index: int, line: str) -> None:
        with self._lock:
            self.lines.append(f"[server {server_index}] {line.rstrip()}")
            if self._view is not None:
                self._view.value = "\n".join(self.lines)

    def widget(self):
        """The log view (one widget per EngineLog; showing it again shows the same one)."""
        import ipywidgets as w

        with self._lock:
            if self._view is None:
                self._view = w.Textarea(
                    value="\n".join(self.lines), disabled=True, layout=w.Layout(width="100%", height="240px")
                )
            return self._view

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def __repr__(self) -> str:
        return f"EngineLog({len(self.lines)} lines)"

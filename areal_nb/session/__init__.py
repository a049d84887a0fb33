"""The Session (`session.py`, the user-facing API) and its parts: `builder.py` (components from
the config), `runtime.py` (background loop, Ctrl-C), `data.py` (task data), `evaluation.py`
(greedy evaluation episodes), `checkpoint.py` (save/load), `metrics.py` (TensorBoard/wandb)."""

from .evaluation import EvalResult
from .session import Session

__all__ = ["EvalResult", "Session"]

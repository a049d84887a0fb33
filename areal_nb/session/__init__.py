"""The Session (`session.py`, the user-facing API) and its parts: `leader.py` (what rank 0 builds
and releases), `builder.py` (each component from the config), `parallel.py` (the ranks under
torchrun) and `rank_writes.py` (rank 0's writes), `runtime.py` (background loop, Ctrl-C),
`data.py` (task data), `run_loop.py` (`run()`'s cadence), `step_stats.py` (history rows),
`evaluation.py` (greedy evaluation episodes), `checkpoint.py` (save/load) with `run_state.py`
(the progress it records), `metrics.py` (TensorBoard/wandb)."""

from .evaluation import EvalResult
from .session import Session

__all__ = ["EvalResult", "Session"]

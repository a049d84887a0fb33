"""Where per-step training metrics go besides `session.history`: `logging.backend`.

"none" (the in-notebook dashboard reads `session.history`), "tensorboard" (scalars under
`<run_dir>/tensorboard`), or "wandb" (project = `experiment_name`; `WANDB_MODE=offline` or
`disabled` in the environment keeps it off the network, as wandb itself reads it).
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any, Protocol

from areal_nb.errors import ConfigError


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a stats row (NaN marks 'not measured this step')."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch raises this when the tensorboard package is missing
            raise ImportError(
                "logging.backend='tensorboard' needs the tensorboard package: "
                "pip install 'areal_nb[tensorboard]'"
            ) from e
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "logging.backend='wandb' needs the wandb package: pip install 'areal_nb[wandb]'"
            ) from e
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, dir=str(run_dir), config=config, reinit="create_new")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


def create_metrics_sink(
    backend: str, *, run_dir: Path, project: str, config: dict[str, Any]
) -> MetricsSink | None:
    if backend == "none":
        return None
    if backend == "tensorboard":
        return TensorBoardSink(run_dir / "tensorboard")
    if backend == "wandb":
        return WandbSink(project, run_dir, config)
    raise ConfigError(f"logging.backend must be 'none', 'tensorboard' or 'wandb', got {backend!r}")

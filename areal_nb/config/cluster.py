"""`cluster`: the cluster job an exported run goes to. Its Slurm values are checked here, when the
config is made, not by sbatch when the job is submitted (on another machine, later).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from areal_nb.errors import ConfigError

from .section import Section

_SLURM_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE")
_SLURM_NAME = re.compile(r"[\w.+-]+", re.ASCII)
_SLURM_NAMES = re.compile(r"[\w.+-]+(,[\w.+-]+)*", re.ASCII)  # partitions: a job may name several


class ClusterConfig(Section):
    """`cluster`: where an exported run goes (`session.export` / `areal-nb export`):
    `launch_local.sh` and `job.sbatch` in the run folder are written from these (and stay editable
    there)."""

    nproc_per_node: int = Field(1, ge=1)
    """Trainer processes per node (torchrun --nproc-per-node)."""
    nodes: int = Field(1, ge=1)
    """Slurm nodes in the allocation."""
    infer_nodes: int = Field(0, ge=0)
    """Nodes of the allocation that only run engine servers; 0: the servers share the first
    trainer node (a CPU job, or a small one)."""
    servers_per_node: int = Field(1, ge=1)
    """Engine servers per inference node."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node; 0: a CPU job (gloo, `areal-nb engine-server`)."""
    cpus_per_node: int = Field(2, ge=1)
    """CPUs asked for per node (Slurm --cpus-per-task)."""
    time: str = "01:00:00"
    """The job's time limit (Slurm --time), as text: "01:30:00", "2-00:00:00", "UNLIMITED"."""
    partition: str | None = None
    """Slurm partition(s), comma-separated; None: the cluster's default."""
    account: str | None = None
    """Slurm account; None: the user's default."""
    engine_port: int = Field(30000, ge=1, le=65535)
    """The first engine server's port on a node (the next servers take the ports after it)."""
    rdzv_port: int = Field(29500, ge=1, le=65535)
    """torchrun's rendezvous port on the first trainer node."""

    @field_validator("time", mode="before")
    @classmethod
    def _time_as_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):  # YAML reads 2:00:00 as 7200 (base 60)
            raise ConfigError(
                f"cluster.time must be text, got the number {value}: quote it in YAML "
                f'(time: "02:00:00"), since YAML reads an unquoted 2:00:00 as seconds'
            )
        return value

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        # checked here, not by sbatch when the job is submitted (on another machine, later)
        if not _SLURM_TIME.fullmatch(value):
            raise ConfigError(
                f"cluster.time {value!r} is not a Slurm time limit: minutes, MM:SS, HH:MM:SS, "
                f"D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED (e.g. 01:30:00 or 2-00:00:00)"
            )
        return value

    @field_validator("partition", "account")
    @classmethod
    def _slurm_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        # an #SBATCH line is not shell: a space or quote there makes sbatch reject the script
        several = info.field_name == "partition"
        if value is not None and not (_SLURM_NAMES if several else _SLURM_NAME).fullmatch(value):
            raise ConfigError(
                f"cluster.{info.field_name} {value!r} is not a Slurm name (letters, digits, "
                f"'_', '-', '.'{', comma-separated' if several else ''})"
            )
        return value

    @model_validator(mode="after")
    def _trainer_nodes(self) -> ClusterConfig:
        if self.infer_nodes >= self.nodes:
            raise ConfigError(
                f"cluster.infer_nodes ({self.infer_nodes}) must leave at least one of "
                f"cluster.nodes ({self.nodes}) for the trainer"
            )
        return self

    def check_server_gpus(self, gpus_per_server: int) -> None:
        """The node's GPUs hold `servers_per_node` servers of `gpus_per_server` GPUs each (and,
        with `infer_nodes` 0, the trainer ranks beside them)."""
        servers = self.servers_per_node * gpus_per_server
        if not self.gpus_per_node:
            return
        if servers > self.gpus_per_node:
            raise ConfigError(
                f"cluster.servers_per_node x engine.launch.tp_size x dp_size ({self.servers_per_node} x "
                f"{gpus_per_server} GPUs) exceeds cluster.gpus_per_node ({self.gpus_per_node})"
            )
        if self.infer_nodes == 0 and servers + self.nproc_per_node > self.gpus_per_node:
            raise ConfigError(
                f"with cluster.infer_nodes 0 the engine servers share the trainer's node: their "
                f"{servers} GPU(s) and cluster.nproc_per_node ({self.nproc_per_node}) trainer ranks "
                f"exceed cluster.gpus_per_node ({self.gpus_per_node}); lower nproc_per_node or "
                f"set infer_nodes"
            )

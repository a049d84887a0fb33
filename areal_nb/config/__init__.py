"""One config tree for the Session and the batch job, validated by pydantic.

Loaded from YAML (`load_config("configs/multi_turn_math.yaml", ["actor.lr=1e-5"])`) with dotted
overrides whose values are parsed as YAML scalars, or a `{"actor.lr": 1e-5}` mapping whose values
are used as they are (so an agent instance can be `agent.workflow`). Unknown keys, wrong types and
impossible combinations raise `ConfigError` naming the key. `actor` is the trainer's own
`GRPOConfig` and `data.task` the task generator's `TaskConfig` (dataclasses of lower layers,
validated here field by field).

One module per job: the sections (`model`, `engine`, `agent`, `rollout`, `data`, `run_outputs`:
logging and checkpoints, `cluster`) on a shared base (`section`), the tree they make
(`session_config`), and reading one: `overrides`, `removed_keys` (keys a config no longer has),
`validation_errors` (pydantic's errors in the config file's words) and `loading` (`load_config`,
`dump_config`). Import them from here.
"""

from __future__ import annotations

from areal_nb.data import TaskConfig
from areal_nb.errors import ConfigError
from areal_nb.train import GRPOConfig
from areal_nb.train.lora import LoraConfig

from .agent import AgentConfig, AgentTrainingConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .engine import EngineConfig, LaunchConfig
from .loading import _numeric as _numeric  # checked by the tests: which annotations take numbers
from .loading import _resolved_field_types as _resolved_field_types  # and a dataclass's field types
from .loading import dump_config, load_config
from .model import ModelConfig
from .overrides import to_dict
from .removed_keys import REMOVED_KEYS
from .rollout import RolloutConfig
from .run_outputs import CheckpointConfig, LoggingConfig
from .session_config import SessionConfig

__all__ = [
    "REMOVED_KEYS",
    "AgentConfig",
    "AgentTrainingConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "GRPOConfig",
    "LaunchConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "RolloutConfig",
    "SessionConfig",
    "TaskConfig",
    "dump_config",
    "load_config",
    "to_dict",
]

"""`SessionConfig`: the whole tree, a few run-wide keys and one section per part, and the checks
of knobs that depend on each other across sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from areal_nb.api.vocabulary import check_export_style
from areal_nb.engine.factory import engine_class
from areal_nb.errors import ConfigError
from areal_nb.train import GRPOConfig
from areal_nb.train.lora import LoraConfig

from .agent import AgentConfig, AgentTrainingConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .engine import EngineConfig
from .model import ModelConfig
from .overrides import to_dict
from .rollout import RolloutConfig
from .run_outputs import CheckpointConfig, LoggingConfig
from .section import Section

# The sections whose `seed` is the run's `seed` unless their own is given.
SEEDED_SECTIONS = ("data", "engine")


class SessionConfig(Section):
    """The whole tree: a few run-wide keys and one section per part (each documented below)."""

    experiment_name: str = Field("areal_nb", min_length=1)
    """Names the run: its default folder (`runs/<experiment_name>`) and wandb project."""
    seed: int = 0
    """Seeds Python's, NumPy's and torch's random generators when the Session starts, and is the
    data's and the engine's seed where `data.seed` / `engine.seed` are left out."""
    total_steps: int = Field(20, ge=0)
    """Training steps of run() without an argument, of `areal-nb train` and of the demo."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy (`ModelConfig`)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """What generates tokens (`EngineConfig`)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """The agent and its proxy (`AgentConfig`)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Episodes per step and their sampling (`RolloutConfig`)."""
    actor: GRPOConfig = Field(default_factory=GRPOConfig)
    """The trainer: optimizer, algorithm, loss (`GRPOConfig`)."""
    agents: dict[str, AgentTrainingConfig] = Field(default_factory=dict)
    """Agents that train their own LoRA adapter on one shared base: `{solver: {lora: {r: 8}},
    checker: {lora: {r: 8}}}` (`AgentTrainingConfig`). A call trains, and is served by, the adapter
    of the agent its `model` names; a call naming another agent is refused (400). The embedded
    engine runs one copy per agent; engine servers hold every agent's adapter. Empty: one policy
    plays every agent (`actor.lora` or full weights)."""
    data: DataConfig = Field(default_factory=DataConfig)
    """The task's rows (`DataConfig`)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """The run folder and metrics (`LoggingConfig`)."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Periodic checkpoints (`CheckpointConfig`)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """An exported run's cluster job (`ClusterConfig`)."""

    @model_validator(mode="after")
    def _combinations(self) -> SessionConfig:
        # One seed for the run: a part is seeded apart only where its own key is given. The value
        # taken from `seed` stays unset, so a copy of this config with another `seed` follows it.
        for name in SEEDED_SECTIONS:
            part = getattr(self, name)
            if "seed" not in part.model_fields_set:
                part.seed = self.seed
                part.model_fields_set.discard("seed")
        check_export_style(
            self.agent.export_style, {"agent.chat_template_type": self.agent.chat_template_type}
        )
        if self.actor.replay_sampling_masks and not engine_class(self.engine.type).records_sampling_masks:
            raise ConfigError(
                f"actor.replay_sampling_masks needs engine.type 'local', got {self.engine.type!r}: only the "
                "embedded engine records which tokens each sampled token was drawn among (grammar, top-k, "
                "top-p); SGLang's replies do not say, so there is nothing to replay"
            )
        if self.agents:
            self._check_agents()
        self.cluster.check_server_gpus(self.engine.launch.gpus_per_server)
        if self.rollout.max_concurrent_rollouts < self.rollout.group_size:
            raise ConfigError(
                f"rollout.max_concurrent_rollouts ({self.rollout.max_concurrent_rollouts}) must be >= "
                f"rollout.group_size ({self.rollout.group_size}): a group starts all its samples together"
            )
        return self

    def _check_agents(self) -> None:
        if self.actor.lora is not None:
            raise ConfigError(
                "agents gives each agent its own LoRA adapter; actor.lora trains one adapter for all: "
                "set one or the other"
            )
        blank = [name for name in self.agents if not name.strip()]
        if blank:
            raise ConfigError("agents: an agent's name (the `model` its calls send) cannot be blank")

    def as_data(self) -> dict[str, Any]:
        """This config as the plain data `load_config` reads (Python objects kept), without the
        keys it derived: validated again with other overrides, they are derived again."""
        data = to_dict(self)
        for name in SEEDED_SECTIONS:
            if "seed" not in getattr(self, name).model_fields_set:
                del data[name]["seed"]
        return data

    @property
    def agent_lora(self) -> dict[str, LoraConfig]:
        """`agents`' adapters by agent name (empty: no agent trains an adapter of its own)."""
        return {name: seat.lora for name, seat in self.agents.items()}

    @property
    def trains_adapters(self) -> bool:
        """Whether the policy is LoRA adapters on a frozen base (`actor.lora` or `agents`): a
        checkpoint then names the base instead of copying it, and the KL reference is the base."""
        return self.actor.lora is not None or bool(self.agents)

    @property
    def run_dir(self) -> Path:
        """Where this run writes logs, metrics and its final checkpoint."""
        return Path(self.logging.run_dir or Path("runs") / self.experiment_name)

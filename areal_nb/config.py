"""One dataclass config tree for the Session and the batch job.

Loaded from YAML (`load_config("configs/multi_turn_math.yaml", ["actor.lr=1e-5"])`) with dotted
overrides whose values are parsed as YAML scalars. Unknown keys, wrong types and impossible
combinations raise `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from areal_nb.data import TaskConfig
from areal_nb.train import GRPOConfig


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


@dataclass
class ModelConfig:
    path: str = "tiny-math"  # "tiny-math", a local directory, or a Hugging Face id
    dtype: str = "float32"
    device: str | None = None  # None: cuda if available, else cpu


@dataclass
class EngineConfig:
    type: str = "local"  # "local" (embedded transformers engine) | "sglang"
    max_batch_size: int = 64
    seed: int = 0


@dataclass
class AgentConfig:
    # An import string, a class, or an instance with `async run(data, **kw)` (proxy path), or a
    # RolloutWorkflow (direct path). Strings keep the config serialisable.
    workflow: Any = "areal_nb.agents.math_agent.MultiTurnMathAgent"
    workflow_kwargs: dict = field(default_factory=lambda: {"max_turns": 2})
    mode: str = "inline"  # "inline" | "subproc"
    chat_template_type: str = "concat"  # "hf" | "concat"
    export_style: str = "concat"  # "individual" | "concat"
    turn_discount: float = 0.9
    discount_mode: str = "tree"  # "tree" | "linear"
    host: str = "127.0.0.1"
    port: int = 0
    admin_api_key: str | None = None  # None: a random key per Session
    session_timeout: float = 3600.0
    agent_timeout: float | None = 120.0
    subproc_max_workers: int = 2


@dataclass
class RolloutConfig:
    batch_size: int = 16  # prompts per training step
    group_size: int = 4  # samples per prompt (GRPO group)
    max_head_offpolicyness: int = 2  # how many versions a trained token may lag behind
    max_concurrent_rollouts: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    prefetch: bool = True  # run() keeps rollouts going while training, within the staleness bound


@dataclass
class DataConfig:
    source: str = "generated"  # "generated" or a GSM8K-format JSONL path
    seed: int = 0
    eval_size: int = 200
    task: TaskConfig = field(default_factory=TaskConfig)


@dataclass
class LoggingConfig:
    run_dir: str = "runs/default"
    eval_every: int = 0  # 0: evaluate only when asked
    progress: bool = True


@dataclass
class CheckpointConfig:
    save_dir: str | None = None
    save_every: int = 0


@dataclass
class SessionConfig:
    experiment_name: str = "areal_nb"
    seed: int = 0
    total_steps: int = 20
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: GRPOConfig = field(default_factory=GRPOConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> SessionConfig:
        choices = {
            "engine.type": (self.engine.type, ("local", "sglang")),
            "agent.mode": (self.agent.mode, ("inline", "subproc")),
            "agent.chat_template_type": (self.agent.chat_template_type, ("hf", "concat")),
            "agent.export_style": (self.agent.export_style, ("individual", "concat")),
            "agent.discount_mode": (self.agent.discount_mode, ("tree", "linear")),
            "model.dtype": (self.model.dtype, ("float32", "bfloat16", "float16")),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{key} must be one of {list(allowed)}, got {value!r}")
        positive = {
            "rollout.batch_size": self.rollout.batch_size,
            "rollout.group_size": self.rollout.group_size,
            "rollout.max_concurrent_rollouts": self.rollout.max_concurrent_rollouts,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "engine.max_batch_size": self.engine.max_batch_size,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        if self.rollout.max_head_offpolicyness < 0:
            raise ConfigError("rollout.max_head_offpolicyness must be >= 0")
        if self.total_steps < 0:
            raise ConfigError("total_steps must be >= 0")
        if not 0.0 <= self.agent.turn_discount <= 1.0:
            raise ConfigError(f"agent.turn_discount must be in [0, 1], got {self.agent.turn_discount}")
        if self.rollout.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for RL (log-probs of a greedy policy are degenerate)")
        if self.agent.export_style == "concat" and self.agent.chat_template_type != "concat":
            raise ConfigError(
                "agent.export_style='concat' needs agent.chat_template_type='concat' "
                "(concat rows reuse the parent's exact tokens); use export_style='individual' with 'hf'"
            )
        if self.actor.temperature != self.rollout.temperature:
            raise ConfigError(
                f"actor.temperature ({self.actor.temperature}) must equal rollout.temperature "
                f"({self.rollout.temperature}): the trainer recomputes log-probs of the sampling distribution"
            )
        return self


# ----------------------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: expected one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, checking every key and type."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys: {names}"
            raise ConfigError(f"unknown config key {prefix + str(key)!r}{hint}")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e


def to_dict(cfg: Any) -> Any:
    """Plain nested data; objects that are not config data (an agent instance) are kept as they are."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. actor.lr=1e-5)")
    path, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    # YAML 1.1 reads "1e-5" as a string; accept the forms people type for numbers.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return path, value


def apply_overrides(data: dict, overrides: typing.Iterable[str] | dict[str, Any]) -> dict:
    """Apply overrides to a nested dict: `"a.b.c=value"` strings (values parsed as YAML
    scalars) or a `{"a.b.c": value}` mapping (values used as they are)."""
    data = to_dict(data)  # copies the containers, keeps objects such as an agent instance
    items = overrides.items() if isinstance(overrides, dict) else (_parse_override(o) for o in overrides)
    for path, value in items:
        node = data
        parts = path.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {} if part not in node else node[part]
                if not isinstance(node[part], dict):
                    raise ConfigError(f"override {path!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def load_config(source: str | Path | dict | SessionConfig | None = None,
                overrides: typing.Iterable[str] | dict[str, Any] = ()) -> SessionConfig:
    """A validated SessionConfig from a YAML path, a dict, an existing config, or defaults."""
    if isinstance(source, SessionConfig):
        data = to_dict(source)
    elif source is None:
        data = {}
    elif isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    data = apply_overrides(data, overrides) if overrides else data
    return from_dict(SessionConfig, data).validate()


def dump_config(cfg: SessionConfig, path: str | Path | None = None) -> str:
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return text

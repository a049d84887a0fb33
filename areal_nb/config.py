"""One config tree for the Session and the batch job, validated by pydantic.

Loaded from YAML (`load_config("configs/multi_turn_math.yaml", ["actor.lr=1e-5"])`) with dotted
overrides whose values are parsed as YAML scalars, or a `{"actor.lr": 1e-5}` mapping whose values
are used as they are (so an agent instance can be `agent.workflow`). Unknown keys, wrong types and
impossible combinations raise `ConfigError` naming the key. `actor` is the trainer's own
`GRPOConfig` and `data.task` the task generator's `TaskConfig` (dataclasses of lower layers,
validated here field by field).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from areal_nb.api import MAX_TEMPERATURE, MIN_TEMPERATURE
from areal_nb.api.vocabulary import ChatTemplateType, DiscountMode, ExportStyle, check_export_style
from areal_nb.data import TaskConfig
from areal_nb.engine.defaults import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_PREFIX_CACHE_TOKENS,
    DEFAULT_SINGLE_THREAD_ROWS,
)
from areal_nb.engine.factory import check_addresses, engine_class
from areal_nb.errors import ConfigError  # noqa: F401 (re-exported)
from areal_nb.train import GRPOConfig
from areal_nb.train.lora import LoraConfig


class _Section(BaseModel):
    # Unknown keys are errors (with a did-you-mean); values are checked when assigned too.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """`model`: the policy that is trained and served."""

    path: str = "tiny-math"
    """A built-in model ("tiny-math", "tiny-tools"), a local directory, a `.gguf` file (converted
    once to a cached float32 Hugging Face folder; needs the `gguf` package) or a Hugging Face id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The compute dtype: the actor's forward and backward (autocast; FSDP2's param_dtype) and the
    weights the engine serves. The trained weights and AdamW's state stay float32 (master weights,
    `areal_nb.train.precision`), so updates at small learning rates do not round away."""
    device: str | None = None
    """Where the actor trains ("cpu", "cuda", "cuda:1"); None: cuda if available, else cpu."""


class LaunchConfig(_Section):
    """`engine.launch`: how `engine.type: sglang` starts its servers (areal_nb.engine.launch_remote_engine)."""

    command: Literal["sglang", "engine-server"] | list[str] = "sglang"
    """"sglang": `python -m sglang.launch_server`; "engine-server": `areal-nb engine-server` (CPU);
    or a command list with {model} {host} {port} {api_key} {weights_dir} filled in per server."""
    n_servers: int = Field(1, ge=1)
    """Servers to start; requests are spread over them."""
    host: str = "127.0.0.1"
    """The address the servers listen on."""
    ports: list[int] | None = None
    """One port per server; None: a free port for each."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per server (SGLang's --tp-size)."""
    dp_size: int = Field(1, ge=1)
    """Data-parallel replicas inside each server (SGLang's --dp-size)."""
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    """The share of GPU memory SGLang reserves for weights and KV cache; None: SGLang's default."""
    extra_args: list[str] = Field(default_factory=list)
    """More command-line arguments, appended as they are."""
    log_dir: str | None = None
    """Where each server's output goes; None: `<run_dir>/engine_logs`."""
    ready_timeout: float = Field(600.0, gt=0)
    """Seconds a server may take to become healthy before the start fails (`ServerLaunchError`)."""

    @property
    def gpus_per_server(self) -> int:
        """The GPUs one server holds: its tensor-parallel times its data-parallel size (also the
        layout of an exported cluster job's servers)."""
        return self.tp_size * self.dp_size

    @model_validator(mode="after")
    def _ports_match(self) -> LaunchConfig:
        if self.ports is not None and len(self.ports) != self.n_servers:
            raise ConfigError(
                f"engine.launch.ports lists {len(self.ports)} ports for n_servers={self.n_servers}"
            )
        return self


class EngineConfig(_Section):
    """`engine`: what generates the agents' tokens (made by areal_nb.engine.create_engine)."""

    type: Literal["local", "sglang", "remote"] = "local"
    """"local": the embedded transformers engine; "sglang": the Session starts SGLang-API servers
    (`engine.launch`) and stops them on close(); "remote": servers someone else started, at
    `engine.addresses`."""
    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1)
    """Sequences decoded at once: the embedded engine's batch, or each launched server's
    `--max-running-requests`."""
    seed: int = 0
    """The embedded engine's sampling seed."""
    prefix_cache_tokens: int = Field(DEFAULT_PREFIX_CACHE_TOKENS, ge=0)
    """engine.type local: tokens of finished sequences' KV kept, so that a prompt continuing one
    (a multi-turn agent's next turn) prefills only its new tokens; 0: no prefix cache.
    `areal-nb engine-server --prefix-cache-tokens` is the same knob for the CPU servers."""
    single_thread_rows: int = Field(DEFAULT_SINGLE_THREAD_ROWS, ge=0)
    """engine.type local, CPU: decoding steps of at most this many rows run on one torch thread
    (0: all on torch's threads); `areal-nb engine-server --single-thread-rows` is the same knob."""
    addresses: list[str] = Field(default_factory=list)
    """engine.type remote: the servers' base URLs (`http://host:port`), one per server."""
    api_key: str | None = None
    """Sent to the servers as `Authorization: Bearer` (and given to the servers engine.type sglang
    launches); None: no key, or for engine.type remote the `AREAL_NB_API_KEY` environment variable."""
    weights_dir: str | None = None
    """Where the trainer writes new weights for the servers to load (a directory both can read).
    None: `<run_dir>/weights` for sglang; for remote, the weights go over the servers' own default."""
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    """How engine.type sglang starts its servers (`LaunchConfig`)."""

    @model_validator(mode="after")
    def _addresses(self) -> EngineConfig:
        check_addresses(self.type, self.addresses)
        return self


class AgentConfig(_Section):
    """`agent`: the agent that plays each episode, and the proxy it talks to."""

    workflow: Any = "areal_nb.agents.math_agent.MultiTurnMathAgent"
    """An import string, a class, or an instance with `async run(data, **kw)` (it talks to the
    proxy), or a `RolloutWorkflow` (it calls the engine directly). Strings keep the config
    serialisable."""
    workflow_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Exactly what the agent class is constructed with; nothing else is injected (none by
    default: the default agent's own defaults hold, and an agent given as an instance is not
    told that keys nobody set are ignored)."""
    mode: Literal["inline", "subproc"] = "inline"
    """"inline": agents run on the Session's event loop; "subproc": in worker processes (blocking
    or CPU-heavy agents)."""
    chat_template_type: ChatTemplateType = "concat"
    """How a conversation's calls become tokens: "concat" continues the previous call's exact
    tokens, "hf" re-renders the messages with the tokenizer's chat template."""
    export_style: ExportStyle = "concat"
    """How captured calls become training rows: "concat" one row per conversation leaf, "individual"
    one row per call (docs/concepts/exports.md)."""
    turn_discount: float = Field(0.9, ge=0.0, le=1.0)
    """The factor a reward is multiplied by for each turn it travels back (docs/concepts/discounts.md)."""
    discount_mode: DiscountMode = "tree"
    """"tree": rewards travel back along the conversation tree; "linear": along the calls' order."""
    host: str = "127.0.0.1"
    """The address the proxy listens on."""
    port: int = Field(0, ge=0, le=65535)
    """The proxy's port; 0: a free one."""
    admin_api_key: str | None = None
    """The key that opens and closes proxy sessions; None: a random key per Session."""
    # proxy.settings.DEFAULT_SESSION_TIMEOUT (tests/test_config.py checks they agree); not imported
    # from there because importing the proxy loads FastAPI and the OpenAI SDK (~1.8 s) into every
    # config read, e.g. an export's check that its config loads.
    session_timeout: float = Field(3600.0, gt=0)
    """Seconds a proxy session may go without a call before the proxy drops it."""
    agent_timeout: float | None = Field(120.0, gt=0)
    """Seconds the agent may take over one episode before it is cancelled and the episode rejected;
    None: no limit."""
    subproc_max_workers: int = Field(2, ge=1)
    """Agent processes in mode "subproc"."""


class AgentTrainingConfig(_Section):
    """One entry of `agents`: how the agent of that name (the `model` its calls send) trains."""

    lora: LoraConfig
    """The agent's own LoRA adapter ({r, alpha, target_modules}) on the frozen base that
    every agent shares: each agent is its own policy, trained on its own calls only."""


class RolloutConfig(_Section):
    """`rollout`: how many episodes each training step gets, and how they are sampled."""

    batch_size: int = Field(16, ge=1)
    """Prompts per training step."""
    group_size: int = Field(4, ge=1)
    """Samples per prompt (a GRPO group)."""
    max_head_offpolicyness: int = Field(2, ge=0)
    """How many policy versions a trained token may lag behind (0: on-policy)."""
    max_concurrent_rollouts: int = Field(64, ge=1)
    """Episodes in flight at once (at least `group_size`: a group starts all its samples together)."""
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    """The sampling temperature the proxy uses when an agent's request leaves it out (agents
    normally do), and the one the trainer recomputes log-probs at. Above 0, since the log-probs of a greedy
    policy are degenerate for RL; below MIN_TEMPERATURE logits / T overflows float32 and the
    engine refuses the request."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling, when a request leaves it out."""
    max_new_tokens: int = Field(16, ge=1)
    """Tokens generated per call, when a request leaves it out."""
    prefetch: bool = True
    """run() keeps rollouts going while training, within the staleness bound."""
    gil_switch_interval: float | None = Field(2e-4, gt=0, le=1)
    """Python's GIL switch interval (seconds) while episodes are in flight, restored after: the
    engine thread gets the GIL back after each torch op within this time instead of Python's
    5 ms (areal_nb/rollout/switch_interval.py). Process-wide while it lasts; None: leave it."""


class DataConfig(_Section):
    """`data`: the task's rows, for training and for evaluation."""

    source: Any = "generated"
    """"generated" (the built-in arithmetic task, `data.task`); a GSM8K-format JSONL file, a folder
    with train.jsonl/test.jsonl, or "openai/gsm8k"; or your own rows: a JSONL/JSON/Parquet/CSV/TSV
    path, or (from Python) a list of dicts, a pandas DataFrame or a `datasets.Dataset`. Rows reach
    the agent unchanged (areal_nb.data.load_rows)."""
    eval_source: Any = None
    """The held-out rows evaluate() runs on (same forms); None: the source's test split, or
    `eval_fraction` of a row source."""
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """The share of a row source held out for evaluation when there is no `eval_source`."""
    format: Literal["auto", "rows", "gsm8k"] = "auto"
    """How a .jsonl path is read: "auto" reads rows with "question"/"answer" and no "messages" as
    GSM8K (converted to chat prompts), any other file as rows; "rows" / "gsm8k" force one."""
    seed: int = 0
    """Seeds the generated problems, the training rows' shuffle (one per pass over the data) and the
    `eval_fraction` split."""
    eval_size: int | None = Field(None, ge=1)
    """Held-out problems evaluate() runs on: None is 200 of the generated or GSM8K test split, and
    every row of your own held-out rows (a number cuts those too)."""
    task: TaskConfig = Field(default_factory=TaskConfig)
    """The generated task's knobs (`TaskConfig`), read with source "generated"."""


class LoggingConfig(_Section):
    """`logging`: where a run writes, and what it reports."""

    run_dir: str | None = None
    """Where the run writes logs, metrics and its final checkpoint; None: `runs/<experiment_name>`."""
    eval_every: int = Field(0, ge=0)
    """run() evaluates every this many steps (the history's eval_* columns); 0: only when asked."""
    progress: bool = True
    """run() shows a progress bar."""
    backend: Literal["none", "tensorboard", "wandb"] = "none"
    """Where per-step metrics go besides `session.history` and the dashboard."""


class CheckpointConfig(_Section):
    """`checkpoint`: periodic checkpoints during run()."""

    save_dir: str | None = None
    """Where run() saves them (`<save_dir>/step<N>`); None: no periodic checkpoints."""
    save_every: int = Field(0, ge=0)
    """Steps between checkpoints; 0: none."""


_SLURM_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE")
_SLURM_NAME = re.compile(r"[\w.+-]+", re.ASCII)
_SLURM_NAMES = re.compile(r"[\w.+-]+(,[\w.+-]+)*", re.ASCII)  # partitions: a job may name several


class ClusterConfig(_Section):
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


class SessionConfig(_Section):
    """The whole tree: a few run-wide keys and one section per part (each documented below)."""

    experiment_name: str = Field("areal_nb", min_length=1)
    """Names the run: its default folder (`runs/<experiment_name>`) and wandb project."""
    seed: int = 0
    """Seeds Python's, NumPy's and torch's random generators when the Session starts."""
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


# ----------------------------------------------------------------------------- errors


def _section_at(loc: tuple) -> Any:
    """The model or dataclass a validation error's location points into (for did-you-mean)."""
    node: Any = SessionConfig
    for part in loc:
        fields = _field_types(node)
        if part not in fields:
            break
        node = fields[part]
    return node


def _field_types(node: Any) -> dict[str, Any]:
    if isinstance(node, type) and issubclass(node, BaseModel):
        return {name: f.annotation for name, f in node.model_fields.items()}
    if dataclasses.is_dataclass(node):
        return {f.name: f.type for f in dataclasses.fields(node) if f.init}
    return {}


# Keys a config no longer has, by their last two parts: an old file that sets one is told why.
REMOVED_KEYS = {
    ("actor", "temperature"): "the trainer recomputes log-probs at the temperature the engine sampled "
    "at, rollout.temperature: set that one",
    ("lora", "dropout"): "the actor trains in eval mode (so that π_θ is the policy that sampled), where "
    "dropout never runs: delete the key",
    ("cluster", "gpus_per_server"): "an engine server's GPUs are engine.launch.tp_size x dp_size, the "
    "layout the Session launches with: set those",
}


def _without_retired_values(data: dict[str, Any]) -> dict[str, Any]:
    """`data` less the removed keys whose value says what the code now does on its own.

    Checkpoints and run folders written before a key was removed hold it with the value the code
    then required (`actor.temperature` equal to `rollout.temperature`, `cluster.gpus_per_server`
    equal to `engine.launch.tp_size x dp_size`) or that did nothing
    (`lora.dropout: 0.0`): they keep loading. Any other value of a removed key stays, and
    validation names the key that replaced it (`REMOVED_KEYS`). Only the mappings on the way to
    a dropped key are copied: the rest may hold objects that must not be copied (an agent)."""

    def said_anyway(value: Any, implied: Any) -> bool:
        return not isinstance(value, bool) and value == implied

    data = dict(data)
    actor = data.get("actor")
    if isinstance(actor, dict):
        actor = data["actor"] = dict(actor)
        rollout = data.get("rollout")
        sampled_at = rollout.get("temperature", 1.0) if isinstance(rollout, dict) else 1.0
        if "temperature" in actor and said_anyway(actor["temperature"], sampled_at):
            del actor["temperature"]
        if isinstance(actor.get("lora"), dict) and said_anyway(actor["lora"].get("dropout"), 0.0):
            actor["lora"] = {k: v for k, v in actor["lora"].items() if k != "dropout"}
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and "gpus_per_server" in cluster:
        engine = data.get("engine")
        launch = engine.get("launch") if isinstance(engine, dict) else None
        launch = launch if isinstance(launch, dict) else {}
        implied = launch.get("tp_size", 1) * launch.get("dp_size", 1)
        if said_anyway(cluster["gpus_per_server"], implied):
            data["cluster"] = {k: v for k, v in cluster.items() if k != "gpus_per_server"}
    agents = data.get("agents")
    if isinstance(agents, dict):
        data["agents"] = {
            name: {**agent, "lora": {k: v for k, v in agent["lora"].items() if k != "dropout"}}
            if isinstance(agent, dict)
            and isinstance(agent.get("lora"), dict)
            and said_anyway(agent["lora"].get("dropout"), 0.0)
            else agent
            for name, agent in agents.items()
        }
    return data


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true/false",
    "string": "a string",
    "dict": "a mapping",
    "list": "a list",
    "tuple": "a list",
    "dataclass": "a mapping",
    "model": "a mapping",
    "none": "null",
}


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as `key: what is wrong`, in the words of the config file."""
    loc = tuple(p for p in error["loc"] if not str(p).startswith("function-"))
    # pydantic adds the union member or dataclass name as a location step; drop those
    loc = tuple(p for p in loc if p not in ("int", "float", "str", "none", "GRPOConfig", "TaskConfig"))
    key = ".".join(str(p) for p in loc)
    kind, value = error["type"], error.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        removed = REMOVED_KEYS.get((str(loc[-2]), str(loc[-1]))) if len(loc) >= 2 else None
        if removed is not None:
            return f"{key} is no longer a config key: {removed}"
        names = list(_field_types(_section_at(loc[:-1])))
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        prefix = ".".join(str(p) for p in loc[:-1])
        prefix = prefix + "." if prefix else ""
        hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys: {names}"
        return f"unknown config key {key!r}{hint}"
    if kind == "literal_error":
        return f"{key} must be one of {error['ctx']['expected']}, got {value!r}"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(error["ctx"].values()))
        return f"{key} must be {bounds[kind]} {limit}, got {value!r}"
    if kind == "value_error":  # a lower layer's own check (GRPOConfig) or a combination above
        message = str(error["ctx"]["error"])
        return f"{key}: {message}" if key else message
    if kind == "missing_keyword_only_argument" or kind == "missing":
        return f"{key}: required"
    base = kind.split("_")[0]
    if base in _TYPE_WORDS and kind.endswith(("_type", "_parsing", "_from_float", "_fraction")):
        return f"{key}: expected {_TYPE_WORDS[base]}, got {value!r}"
    return f"{key}: {error['msg']}, got {value!r}"


def _config_error(exc: ValidationError, where: str = "") -> ConfigError:
    lines = [_describe(e) for e in exc.errors()]
    head = f"{where}: " if where else ""
    return ConfigError(head + "; ".join(lines))


# ----------------------------------------------------------------------------- loading


def to_dict(cfg: Any) -> Any:
    """Plain nested data; objects that are not config data (an agent instance) are kept as they are."""
    if isinstance(cfg, BaseModel):
        return {name: to_dict(getattr(cfg, name)) for name in type(cfg).model_fields}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def _parse_override(item: str) -> tuple[str, Any]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. actor.lr=1e-5)")
    path, raw = item.split("=", 1)
    if not path.strip() or any(not part.strip() for part in path.strip().split(".")):
        raise ConfigError(
            f"override {_shorten(item)!r}: {_shorten(path)!r} is not a dotted config key (e.g. actor.lr)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        # YAML reserves @ ` % * & ! [ { " ' at the start of a value: quote such a text value
        shown = raw if len(raw) <= 80 else raw[:80] + "..."
        raise ConfigError(
            f"override {_shorten(item)!r}: YAML cannot read the value {shown!r} ({_yaml_problem(exc)}); "
            f"to pass it as text, quote it: {_quoted(path, raw)}"
        ) from None
    # YAML 1.1 reads "1e-5" as a string; accept the forms people type for numbers.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return path, value


def _yaml_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return " ".join(str(problem).split())


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _quoted(path: str, raw: str) -> str:
    """`path=<raw as a YAML double-quoted string>`, quoted for a POSIX shell."""
    text = raw if len(raw) <= 80 else raw[:80] + "..."
    return shlex.quote(f'{path}="' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')


def _apply_overrides(data: dict, overrides: Iterable[str] | dict[str, Any]) -> dict:
    """Apply overrides to a nested dict: `"a.b.c=value"` strings (values parsed as YAML
    scalars) or a `{"a.b.c": value}` mapping (values used as they are)."""
    data = to_dict(data)  # copies the containers, keeps objects such as an agent instance
    items = overrides.items() if isinstance(overrides, dict) else (_parse_override(o) for o in overrides)
    for path, value in items:
        node = data
        parts = path.strip().split(".")
        for part in parts[:-1]:
            if part not in node:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {path!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def load_config(
    source: str | Path | dict | SessionConfig | None = None, overrides: Iterable[str] | dict[str, Any] = ()
) -> SessionConfig:
    """A validated SessionConfig from a YAML path, a dict, an existing config, or defaults."""
    where = ""
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
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
        except (yaml.YAMLError, RecursionError) as exc:
            mark = getattr(exc, "problem_mark", None)
            where_in = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ConfigError(f"{path}: not readable YAML{where_in}: {_yaml_problem(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        where = str(path)
    data = _apply_overrides(data, overrides) if overrides else data
    data = _without_retired_values(data)
    _refuse_bools_as_numbers(data, SessionConfig, "")
    try:
        return SessionConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, where) from None


def _numeric(annotation: Any) -> bool:
    """An int or float field (optional or not), not a bool one."""
    args = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else ()
    )
    kinds = set(args) - {type(None)} if args else {annotation}
    return bool(kinds) and kinds <= {int, float}


def _refuse_bools_as_numbers(data: Any, node: Any, prefix: str) -> None:
    """true/false where a number goes is an error, not 1/0 (pydantic would take a bool as an int)."""
    if not isinstance(data, dict):
        return
    fields = _resolved_field_types(node)
    for key, value in data.items():
        if key not in fields:
            continue
        annotation = fields[key]
        if isinstance(value, bool) and _numeric(annotation):
            count = annotation is int or int in typing.get_args(annotation)
            raise ConfigError(
                f"{prefix}{key}: expected {'an integer' if count else 'a number'}, got "
                f"{str(value).lower()} (a boolean is not a {'count' if count else 'number'})"
            )
        if isinstance(value, dict) and (
            isinstance(annotation, type)
            and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation))
        ):
            _refuse_bools_as_numbers(value, annotation, f"{prefix}{key}.")


def _resolved_field_types(node: Any) -> dict[str, Any]:
    """Field annotations as types (dataclasses of lower layers may hold them as strings)."""
    if dataclasses.is_dataclass(node):
        try:
            hints = typing.get_type_hints(node)
        except Exception:  # noqa: BLE001 - an unresolvable hint: that field is left to pydantic
            hints = {}
        return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(node) if f.init}
    return _field_types(node)


def dump_config(cfg: SessionConfig, path: str | Path | None = None) -> str:
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return text

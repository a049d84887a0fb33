"""`agent`: the agent that plays each episode and the proxy it talks to; an entry of `agents`: how
an agent that trains an adapter of its own trains.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from areal_nb.api.vocabulary import ChatTemplateType, DiscountMode, ExportStyle
from areal_nb.train.lora import LoraConfig

from .section import Section


class AgentConfig(Section):
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


class AgentTrainingConfig(Section):
    """One entry of `agents`: how the agent of that name (the `model` its calls send) trains."""

    lora: LoraConfig
    """The agent's own LoRA adapter ({r, alpha, target_modules}) on the frozen base that
    every agent shares: each agent is its own policy, trained on its own calls only."""

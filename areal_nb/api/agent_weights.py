"""`AgentWeights`: one set of weights per agent, pushed to an engine that serves each agent apart.

When several agents train their own LoRA adapter on one base (the Session's `agents` config), the
trainer pushes each agent's weights under its name: base + that agent's ΔW merged (the embedded
engines), or that agent's `LoraAdapter` (servers that apply adapters). Requests name their agent
in `ModelRequest.agent`, and the engine generates with that agent's weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


def agent_token(agent: str) -> str:
    """An agent's name where its adapter is named: the trainer's peft adapter (a module name, where
    a dot would split state-dict keys) and the adapter folders pushed to engine servers. Every
    character but letters, digits, "_" and "-" becomes "_"."""
    return re.sub(r"[^0-9A-Za-z_-]", "_", agent)


@dataclass(frozen=True)
class AgentWeights:
    # agent name → what `update_weights` takes for one policy (a state dict or a `LoraAdapter`)
    per_agent: dict[str, Any]

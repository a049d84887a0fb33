"""`AgentWeights`: one set of weights per agent, pushed to an engine that serves each agent apart.

When several agents train their own LoRA adapter on one base (the Session's `agents` config), the
trainer pushes each agent's weights under its name: base + that agent's ΔW merged (the embedded
engines), or that agent's `LoraAdapter` (servers that apply adapters). Requests name their agent
in `ModelRequest.agent`, and the engine generates with that agent's weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgentWeights:
    # agent name → what `update_weights` takes for one policy (a state dict or a `LoraAdapter`)
    per_agent: dict[str, Any]

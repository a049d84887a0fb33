"""Keys a config no longer has: `REMOVED_KEYS` says why for each (validation names its replacement),
and `without_retired_values` drops those whose value says what the code now does anyway, so that
checkpoints and run folders written before a key was removed keep loading.
"""

from __future__ import annotations

from typing import Any

# By the key's last two parts: an old file that sets one is told why it went and what to set.
REMOVED_KEYS = {
    ("actor", "temperature"): "the trainer recomputes log-probs at the temperature the engine sampled "
    "at, rollout.temperature: set that one",
    ("lora", "dropout"): "the actor trains in eval mode (so that π_θ is the policy that sampled), where "
    "dropout never runs: delete the key",
    ("cluster", "gpus_per_server"): "an engine server's GPUs are engine.launch.tp_size x dp_size, the "
    "layout the Session launches with: set those",
}


def without_retired_values(data: dict[str, Any]) -> dict[str, Any]:
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

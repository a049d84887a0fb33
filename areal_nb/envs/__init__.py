"""Environments from the ecosystem as agents: OpenEnv servers played over their WebSocket session,
`verifiers` environments played through their own rollout.

An environment here is an agent like any other (`run(data, base_url, api_key, http_client)`):
its model calls go through the proxy, so the tokens trained on are the ones the engine sampled,
and its reward is the environment's.
"""

from .errors import EnvironmentServerError
from .openenv import OpenEnvAgent, OpenEnvServer, message_action, observation_text
from .verifiers_env import VerifiersAgent, task_rows

__all__ = [
    "EnvironmentServerError",
    "OpenEnvAgent",
    "OpenEnvServer",
    "VerifiersAgent",
    "message_action",
    "observation_text",
    "task_rows",
]

"""Environments from the ecosystem as agents: OpenEnv servers played over their WebSocket session,
`verifiers` environments (the 0.4 `verifiers.v1` stack and the classic one of 0.1 to 0.3) played
through their own rollout.

An environment here is an agent like any other (`run(data, base_url, api_key, http_client)`):
its model calls go through the proxy, so the tokens trained on are the ones the engine sampled,
and its reward is the environment's.
"""

from .errors import EnvironmentServerError
from .openenv import OpenEnvAgent, OpenEnvServer, message_action, observation_text
from .verifiers_env import VerifiersAgent, task_rows
from .verifiers_legacy import LegacyVerifiersAgent, legacy_rows

__all__ = [
    "EnvironmentServerError",
    "LegacyVerifiersAgent",
    "OpenEnvAgent",
    "OpenEnvServer",
    "VerifiersAgent",
    "legacy_rows",
    "message_action",
    "observation_text",
    "task_rows",
]

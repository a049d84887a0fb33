"""The classic `verifiers` environments as agents: one episode is the environment's own rollout,
its model calls through the proxy, its reward the environment's rubric score.

The classic stack (the `verifiers` environments of releases up to 0.3: `vf.SingleTurnEnv`,
`vf.MultiTurnEnv`, `vf.ToolEnv`, any `vf.Environment` subclass, scored by a `vf.Rubric`) was
dropped in 0.4; 0.3.1 ships it as `verifiers.legacy`, also reached as
`import verifiers as vf; vf.SingleTurnEnv`, and that is what this agent drives. Such an
environment holds its dataset (rows with a `prompt` message list, an `answer`, an `example_id`,
perhaps `info`) and plays one row as `Environment.run_rollout(row, client, model, sampling_args)`:
its own rollout loop (`env_response` between turns, its tools run by `ToolEnv`, its stop
conditions), then its rubric's `score_rollout`. The client here is the environment's own
`OpenAIChatCompletionsClient` around an `openai.AsyncOpenAI` pointing at the proxy with the
episode's key, so the proxy records exactly the tokens behind each reply the environment received,
and the rubric's score (its reward functions, weighted and summed by `verifiers`) is the episode's.

    import verifiers as vf
    env = vf.SingleTurnEnv(dataset=..., eval_dataset=..., rubric=vf.Rubric(funcs=[correct]))
    agent = LegacyVerifiersAgent(env, sampling={"max_tokens": 64})
    Session(dataset=legacy_rows(env), eval_dataset=legacy_rows(env, "eval"), agent__workflow=agent)

A row is one of the environment's dataset rows as `Dataset.to_list()` gives it, the form the
environment's own `generate` feeds its rollouts. A rollout the environment marks failed (a model
call that failed, a tool the environment stops on, `setup_state` raising a `vf.Error`) or that
raises is rejected with its errors (`EnvironmentServerError`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from areal_nb.agents.sdk_agent import openai_client
from areal_nb.errors import ArgumentTypeError, DatasetError, InvalidArgumentError

from .errors import EnvironmentServerError

SPLITS = ("train", "eval")


def _legacy():
    try:
        import verifiers.legacy as vf
    except ImportError as exc:  # the optional extra (0.4 has no verifiers.legacy)
        raise ImportError(
            "LegacyVerifiersAgent needs the classic `verifiers` stack, which release 0.3.1 ships: "
            "pip install 'areal_nb[verifiers-legacy]'"
        ) from exc
    return vf


def legacy_rows(
    env: Any, split: str = "train", n: int | None = None, seed: int | None = None
) -> list[dict[str, Any]]:
    """The Session's rows for a classic environment: its `train` dataset (`env.get_dataset`) or
    its `eval` dataset (`env.get_eval_dataset`, which falls back to the train dataset when the
    environment has none), the first `n` rows (after a shuffle with `seed`, if given), each as
    `Dataset.to_list()` gives it."""
    if split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {SPLITS}, got {split!r}")
    get = env.get_dataset if split == "train" else env.get_eval_dataset
    return get(-1 if n is None else n, seed).to_list()


class LegacyVerifiersAgent:
    """Plays one rollout of a classic `verifiers` environment per dataset row and returns its
    rubric's score.

    `env`: a `verifiers` (0.3.1, the classic stack) `Environment` (`SingleTurnEnv`,
    `MultiTurnEnv`, `ToolEnv`, ...), or the id of an installed environment package, loaded with
    `vf.load_environment(env, **env_args)`. `model`: the model name the environment sends (the
    proxy tags calls with it). `sampling`: sampling arguments for every call, over the
    environment's own `sampling_args` as its `generate` merges them (e.g. `{"max_tokens": 64}`;
    `verifiers` sends it as `max_completion_tokens`); None leaves the environment's.
    """

    def __init__(
        self,
        env: Any,
        *,
        model: str = "default",
        sampling: Mapping[str, Any] | None = None,
        env_args: Mapping[str, Any] | None = None,
    ) -> None:
        vf = _legacy()
        if isinstance(env, str):
            env = vf.load_environment(env, **dict(env_args or {}))
        elif env_args:
            raise ArgumentTypeError("env_args goes with an environment id, not with an Environment")
        if not isinstance(env, vf.Environment):
            raise ArgumentTypeError(
                f"env must be a classic verifiers Environment or an environment id, got {type(env).__name__}"
            )
        if env.message_type != "chat":
            raise InvalidArgumentError(
                f"the environment's message_type is {env.message_type!r}: the proxy serves chat "
                "completions, so only chat environments (message_type 'chat') can play through it"
            )
        if env.requires_group_rollouts:
            raise InvalidArgumentError(
                "the environment's rubric has group reward functions (scored over a group of "
                "rollouts at once); here each rollout is an episode of its own, scored alone"
            )
        self.env = env
        self.model = model
        self.sampling = dict(sampling or {})

    def sampling_args(self) -> dict[str, Any]:
        """What every call of an episode samples with: the environment's `sampling_args`, updated
        with the agent's `sampling` (as the environment's `generate` merges its argument)."""
        merged = copy.deepcopy(self.env.sampling_args)
        merged.update(copy.deepcopy(self.sampling))
        return merged

    async def run(
        self,
        data: dict[str, Any],
        base_url: str | None = None,
        api_key: str | None = None,
        http_client: Any = None,
        **_unused: Any,
    ) -> float:
        vf = _legacy()
        from verifiers.legacy.clients import OpenAIChatCompletionsClient

        if "prompt" not in data or "example_id" not in data:
            raise DatasetError(
                "a classic verifiers row has a 'prompt' and an 'example_id' (rows from "
                f"legacy_rows(env)); this one has {sorted(data)}"
            )
        # The proxy's key is the episode's, so a client per episode; `max_retries=0`: a retried call
        # would be a second, unlinked generation in the episode.
        client = OpenAIChatCompletionsClient(openai_client(base_url, api_key, http_client))
        try:
            output = await self.env.run_rollout(data, client, self.model, self.sampling_args())
        except vf.Error as exc:
            raise EnvironmentServerError(f"the verifiers rollout failed: {_chain(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - the environment's own code, whatever it raised
            raise EnvironmentServerError(
                f"the verifiers environment raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if http_client is None:  # a client of its own: close it (a given one is the caller's)
                await client.close()
        error = output.get("error")
        if error is not None:
            raise EnvironmentServerError(f"the verifiers rollout failed: {error['error_chain_repr'][-2000:]}")
        return float(output["reward"])

    def close(self) -> None:
        """Nothing to stop: the environment holds no server between episodes."""


def _chain(error: BaseException) -> str:
    from verifiers.legacy.utils.error_utils import ErrorChain

    return repr(ErrorChain(error))[-2000:]

"""`verifiers` environments as agents: one episode is the environment's own rollout, its model
calls through the proxy, its reward the environment's.

A `verifiers` (0.4, `verifiers.v1`) environment is a taskset (typed tasks with their `@reward`s),
the seats that play it (`AgentConfig`s, each with a harness: the program that talks to the
model) and `Env.run` (how one task becomes one episode). Every model call of a harness goes to
the environment's interception server on loopback, which relays it unchanged to the run's
OpenAI-compatible endpoint — here the proxy, with the episode's key. So the proxy records exactly
the tokens behind each reply the harness received, and the trace's reward (its `@reward`s,
weighted and summed by `verifiers`) is the episode's.

    import verifiers.v1 as vf
    env = vf.load_environment(vf.EnvConfig(taskset={"id": "my_taskset"}))
    agent = VerifiersAgent(env)
    Session(dataset=task_rows(env.taskset.take(64)),
            eval_dataset=task_rows(env.taskset.skip(64).take(16)), agent__workflow=agent)

A task row is the task's own data (`TaskData` as JSON); the agent rebuilds the task from it, so
any rows the taskset's data type accepts will do. An episode `verifiers` marks failed (the
harness exited non-zero, a reward raised, `Env.run` raised) is rejected with its errors.

Seats that are not trainable (`agents.user.trainable = False` in the environment's `Env.setup`:
a simulated user, a judge) play against the same engine through the same proxy, but their calls
are not training data: right after `Env.setup`, each untrainable seat whose calls reach the proxy
gets `store: false` in its sampling, so `verifiers` sends it with every one of that seat's
calls and the proxy answers them without recording them. Only the trainable seats' calls are in
the episode's rows, and the reward is theirs. The proxy honours `store: false` on every door that
records (Chat Completions, Responses, Messages and text completions); a seat marked untrainable
later than `Env.setup`, or one whose harness calls another path, would be recorded: such an
episode is rejected with that reason instead of being trained on. A seat with a client of its own (`AgentConfig`'s
`client`) does not reach the proxy and is left as it is.

Several trainable seats (two players, a proposer and a solver) are several agents: when more than
one trainable seat plays the run's model through the proxy, each seat's calls name the seat as
their `model`, so the proxy tags them apart (each seat's calls form their own trees, and GRPO
compares a seat's rows only with the same seat's), and the episode's reward is `AgentRewards`:
each seat's trace reward on its own last call. With the Session's `agents: {seat: {lora: ...}}`
each seat then trains an adapter of its own. A seat that pins a model of its own keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from areal_nb.api import AgentRewards
from areal_nb.errors import ArgumentTypeError, InvalidArgumentError

from .errors import EnvironmentServerError

_KEY_VARIABLE_PREFIX = "AREAL_NB_VERIFIERS_KEY_"
# the proxy's doors that answer a call without recording it when the body says `store: false`
_UNRECORDED_PATHS = frozenset({"/chat/completions", "/responses", "/v1/messages"})


def _verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as exc:  # the optional extra
        raise ImportError(
            "VerifiersAgent needs the `verifiers` package (0.4): pip install 'areal_nb[verifiers]'"
        ) from exc
    return vf


def task_rows(tasks: Iterable[Any], limit: int | None = None) -> list[dict[str, Any]]:
    """The Session's rows for a taskset (or any view of one: `taskset.take(n)`, `.skip(n)`,
    `.shuffle(seed)`): each task's data as plain JSON. `limit` caps an infinite taskset."""
    source = tasks if limit is None else itertools.islice(tasks, limit)
    return [task.data.model_dump(mode="json", exclude_defaults=True) for task in source]


class VerifiersAgent:
    """Plays one `verifiers` episode per task row and returns the environment's reward.

    `env`: a `verifiers.v1.Env`, or the id of an installed taskset (loaded by name, its own
    environment or `SingleAgentEnv`, each seat in the local subprocess runtime). `model`: the
    model name the harness sends (the proxy tags calls with it). `sampling`: the `verifiers`
    sampling fields for every call (e.g. `{"max_tokens": 64}`); None leaves the proxy's
    defaults. The reward is the sum of the trainable seats' trace rewards (for a single-agent
    environment: its one trace's reward), or with several trainable seats each seat's own
    (`AgentRewards`); the untrainable seats' calls are answered but not recorded (see the
    module's docstring). The agent wraps `env.setup` to mark them.
    """

    def __init__(
        self, env: Any, *, model: str = "default", sampling: Mapping[str, Any] | None = None
    ) -> None:
        vf = _verifiers()
        if isinstance(env, str):
            env = vf.load_environment(_local_config(vf, env))
        if not isinstance(env, vf.Env):
            raise ArgumentTypeError(
                f"env must be a verifiers.v1.Env or a taskset id, got {type(env).__name__}"
            )
        # `Env.setup` is where an environment decides which seats train, and the one hook
        # `run_episode` calls between building the episode's agents and running them: the
        # untrainable seats' calls are marked unrecorded there, on this environment object.
        if not isinstance(env.__dict__.get("setup"), _SetupThenUnrecordUntrainable):
            env.setup = _SetupThenUnrecordUntrainable(env, model)
        env.setup.model = model
        self.env = env
        self.model = model
        self.sampling = vf.Sampling(**dict(sampling or {}))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._holder: tuple[asyncio.Task[None], asyncio.Event] | None = None
        self._users = 0

    def task(self, row: Mapping[str, Any]) -> Any:
        """The environment's task for a row (its data type validates the row)."""
        task_cls = type(self.env.taskset).task_type()
        data = task_cls.data_type().model_validate(dict(row))
        return task_cls(data, self.env.taskset.config.task)

    async def run(
        self,
        data: dict[str, Any],
        base_url: str | None = None,
        api_key: str | None = None,
        **_unused: Any,
    ) -> float | AgentRewards:
        vf = _verifiers()
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        if not base_url:
            raise InvalidArgumentError("VerifiersAgent.run needs base_url (the proxy's /v1 URL)")
        task = self.task(data)
        # verifiers reads the endpoint's key from an environment variable by name: one name per
        # episode, so concurrent episodes each reach the proxy with their own session key.
        variable = _KEY_VARIABLE_PREFIX + uuid.uuid4().hex
        os.environ[variable] = api_key
        try:
            client = vf.EvalClientConfig(base_url=base_url, api_key_var=variable)
            context = vf.ModelContext(model=self.model, client=client, sampling=self.sampling)
            async with self._serving():
                episode = await self.env.run_episode(task, context)
        finally:
            os.environ.pop(variable, None)
        if not episode.ok:
            raise EnvironmentServerError(f"the verifiers episode failed: {_errors(episode)}")
        _check_untrainable_unrecorded(episode)
        return _episode_reward(episode, self.model)

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        """The environment's serving resources (its interception server, shared tool servers) for
        the episodes in flight: brought up by the first, torn down when the last one ends.
        `Env.serving()` keeps them on the environment, so concurrent episodes must share one; it
        is entered and left in one holder task, as an async context must be."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (a Session's, or asyncio.run): fresh state
            self._loop, self._lock, self._holder, self._users = loop, asyncio.Lock(), None, 0
        lock = self._lock
        assert lock is not None  # made with the loop's state just above
        async with lock:
            if self._holder is None:
                ready: asyncio.Future[None] = loop.create_future()
                release = asyncio.Event()
                task = asyncio.create_task(self._hold(ready, release))
                try:
                    await ready
                except BaseException:
                    await asyncio.gather(task, return_exceptions=True)
                    raise
                self._holder = (task, release)
            self._users += 1
        try:
            yield
        finally:
            async with lock:
                self._users -= 1
                if self._users == 0 and self._holder is not None:
                    (task, release), self._holder = self._holder, None
                    release.set()
                    await task

    async def _hold(self, ready: asyncio.Future[None], release: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                ready.set_result(None)
                await release.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                return
            raise

    def __getstate__(self) -> dict[str, Any]:  # to a worker process: no event-loop state
        return {**self.__dict__, "_loop": None, "_lock": None, "_holder": None, "_users": 0}

    def close(self) -> None:
        """Nothing to stop: the environment is served only while episodes are in flight."""


class _SetupThenUnrecordUntrainable:
    """The environment's own `Env.setup`, then `store: false` in the sampling of every seat it
    left untrainable whose calls go to the proxy (the episode's key variable): `verifiers` imposes
    a seat's sampling on each call it relays, extra keys included, and the proxy does not record a
    call that says `store: false`. The seat's config gets the same sampling, so its trace records
    it (`_check_untrainable_unrecorded` reads it back). The environment run elsewhere (another
    endpoint, no episode key) is unchanged. A class, not a closure: the agent, and so the
    environment, may be pickled to a worker process."""

    def __init__(self, env: Any, model: str) -> None:
        self.env = env
        self.model = model  # the run's model: what an unpinned seat sends

    async def __call__(self, agents: Any) -> None:
        from verifiers.v1.configs.agent import agent_config_fields  # the seats `Agents` is built from

        await type(self.env).setup(self.env, agents)
        seats = {name: getattr(agents, name) for name in agent_config_fields(self.env.config)}
        for agent in seats.values():
            if agent.trainable or not _reaches_proxy(agent.ctx.client):
                continue
            sampling = agent.ctx.sampling.model_copy(update={"store": False})
            agent.ctx = dataclasses.replace(agent.ctx, sampling=sampling)
            agent.config = agent.config.model_copy(update={"sampling": sampling})
        # several trainable seats on the run's model: each seat's calls name the seat (one agent each)
        players = {
            name: a
            for name, a in seats.items()
            if a.trainable and _reaches_proxy(a.ctx.client) and a.ctx.model == self.model
        }
        if len(players) > 1:
            for name, agent in players.items():
                agent.ctx = dataclasses.replace(agent.ctx, model=name)
                agent.config = agent.config.model_copy(update={"model": name})


def _episode_reward(episode: Any, model: str) -> float | AgentRewards:
    """The trainable seats' rewards: their sum when they all play one agent (the `model` their
    calls send), else each agent's (`AgentRewards`), for the seats whose calls reach the proxy."""
    rewards: dict[str, float] = {}
    for trace in episode.traces:
        if trace.agent.trainable:
            agent = trace.agent.config.model or model
            rewards[agent] = rewards.get(agent, 0.0) + float(trace.reward)
    if len(rewards) <= 1:
        return float(sum(rewards.values()))
    playing = {
        t.agent.config.model or model
        for t in episode.traces
        if t.agent.trainable and _reaches_proxy(t.agent.config.client) and t.calls
    }
    return AgentRewards({agent: reward for agent, reward in rewards.items() if agent in playing})


def _reaches_proxy(client: Any) -> bool:
    """Whether a seat's client is the run's: the proxy, with an episode's key."""
    return client is not None and client.api_key_var.startswith(_KEY_VARIABLE_PREFIX)


def _check_untrainable_unrecorded(episode: Any) -> None:
    """Refuses an episode in which an untrainable seat's call may have been recorded for training:
    the seat was marked untrainable after `Env.setup` (its calls did not say `store: false`), or
    its harness called a door that records regardless of `store`."""
    for trace in episode.traces:
        config = trace.agent.config
        if trace.agent.trainable or not trace.calls or not _reaches_proxy(config.client):
            continue
        seat = trace.agent.name
        if (config.sampling.model_extra or {}).get("store") is not False:
            raise EnvironmentServerError(
                f"the verifiers seat {seat!r} is not trainable but its calls were recorded for "
                "training: it was marked untrainable after Env.setup(); set `trainable = False` "
                "in the environment's setup()"
            )
        recorded = sorted({call.endpoint for call in trace.calls if call.endpoint not in _UNRECORDED_PATHS})
        if recorded:
            raise EnvironmentServerError(
                f"the verifiers seat {seat!r} is not trainable but its harness called "
                f"{', '.join(recorded)}, where the proxy may record its calls for training; give "
                f"that seat a harness that calls one of {sorted(_UNRECORDED_PATHS)}, or a client of its own"
            )


def _local_config(vf: Any, taskset_id: str) -> Any:
    """The run config of a taskset by id, every seat in the local subprocess runtime."""
    config_type = vf.env_config_type(taskset_id)
    seats = {
        name: {"runtime": {"type": "subprocess"}}
        for name, field in config_type.model_fields.items()
        if isinstance(field.default, vf.AgentConfig)
    }
    return config_type.model_validate({"taskset": {"id": taskset_id}, **seats})


def _errors(episode: Any) -> str:
    errors = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
    if not errors:
        return "no error recorded"
    return "; ".join(f"{e.type}: {e.message}" for e in errors)[-2000:]

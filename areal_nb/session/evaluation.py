"""`evaluate()`: the configured agent, decoding greedily, on held-out problems.

Evaluation runs the *same* workflow as training (no copy of the agent's loop), through the same
engine, with one difference: every generation is greedy. Agents behind the proxy reach the
engine through a second proxy app mounted at `/eval` that serves a `GreedyEngine` view of it;
direct `RolloutWorkflow`s get the view as their engine. Evaluation episodes run on their own
executor: they are never training data, and the policy version does not move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from areal_nb.api import InferenceEngine, ModelRequest, ModelResponse, RolloutWorkflow
from areal_nb.data import check_rows, load_rows
from areal_nb.errors import CallOrderError, InvalidArgumentError
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import RolloutExecutor

EVAL_PREFIX = "/eval"  # where the greedy proxy app is mounted on the Session's proxy
EVAL_COLUMNS = ("eval_reward", "eval_accuracy", "eval_agent_accuracy")  # history columns, see as_dict


class GreedyEngine(InferenceEngine):
    """A read-only view of an engine that decodes every request greedily.

    Sampling settings of the request are overridden; budgets, stops and the engine's weights and
    version are the engine's own. Weight updates and closing go to the engine itself, not here.
    """

    weights_may_differ = False  # (weights are not pushed here: `update_weights` refuses)

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        # capabilities: the engine's own
        self.max_context = engine.max_context
        self.serves_lora_adapters = engine.serves_lora_adapters
        self.records_sampling_masks = engine.records_sampling_masks
        self.serves_models_in_process = engine.serves_models_in_process
        self.shares_weights = engine.shares_weights
        self.stats = engine.stats

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        greedy = dataclasses.replace(req, gconfig=req.gconfig.new(greedy=True))
        return await self.engine.agenerate(greedy)

    def get_version(self) -> int:
        return self.engine.get_version()

    def rng_state(self) -> Any:
        return self.engine.rng_state()

    def set_rng_state(self, state: Any) -> None:
        self.engine.set_rng_state(state)

    def set_version(self, version: int) -> None:
        raise CallOrderError("GreedyEngine is an evaluation view; set the version on the engine itself")

    def update_weights(self, weights: Any, version: int | None = None) -> None:
        raise CallOrderError("GreedyEngine is an evaluation view; update the weights of the engine itself")

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()

    def abort(self, rid: str) -> None:
        self.engine.abort(rid)

    def abort_all(self) -> None:
        self.engine.abort_all()

    def drop_caches(self) -> None:
        self.engine.drop_caches()

    def close(self) -> None:
        """Nothing to release: the view owns nothing."""


@dataclass(frozen=True)
class EvalResult:
    """Greedy episodes of the configured agent on `n` held-out problems.

    `reward_mean` is the mean episode return (sum of the rewards the agent set, before discount)
    over accepted episodes, the same quantity as the training `reward_mean`. The two accuracies
    count every problem (a rejected episode solved nothing): `accuracy`, the first call of the
    episode was rewarded (> 0) — for the math agent, first-reply accuracy; `agent_accuracy`, some
    call was rewarded — success within the agent's own turns. With several agents in the episodes
    (calls tagged by their `model`), `agent_rewards` holds each one's mean return over the accepted
    episodes it took part in, as training's `reward_mean/<agent>`.
    """

    reward_mean: float
    accuracy: float
    agent_accuracy: float
    n: int
    rejected: int
    version: int
    batch: RolloutBatch = field(repr=False, compare=False)
    # With `evaluate(pass_k=k)`: the share of problems that k sampled episodes (rollout.temperature)
    # solved at least once (some call rewarded > 0), the share of those k·n episodes whose first
    # call was rewarded (the sampled policy's accuracy, as `accuracy` is the greedy one's: the
    # figure training moves first, and with k·n episodes a steadier one), and the episodes.
    k: int | None = None
    pass_at_k: float | None = None
    sampled_accuracy: float | None = None
    samples: RolloutBatch | None = field(default=None, repr=False, compare=False)
    agent_rewards: dict[str | None, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        """The figures as `session.history` columns (plus `eval_pass@k` when it was measured, and
        `eval_reward/<agent>` with several agents)."""
        out = dict(zip(EVAL_COLUMNS, (self.reward_mean, self.accuracy, self.agent_accuracy), strict=True))
        if self.k is not None and self.pass_at_k is not None:  # (measured together)
            out[f"eval_pass@{self.k}"] = self.pass_at_k
        if self.sampled_accuracy is not None:
            out["eval_sampled_accuracy"] = self.sampled_accuracy
        out.update({f"{EVAL_COLUMNS[0]}/{agent}": mean for agent, mean in self.agent_rewards.items()})
        return out


async def run_greedy_episodes(
    workflow: RolloutWorkflow,
    engine: InferenceEngine,
    problems: list[dict],
    *,
    max_concurrent: int,
    episode_timeout: float | None,
    switch_interval: float | None = None,
    rows_name: str = "problem",
) -> list:
    """One greedy episode per problem, on an executor of their own (no staleness accounting)."""
    return await run_episodes(
        workflow,
        GreedyEngine(engine),
        problems,
        group_size=1,
        max_concurrent=max_concurrent,
        episode_timeout=episode_timeout,
        switch_interval=switch_interval,
        rows_name=rows_name,
    )


async def run_episodes(
    workflow: RolloutWorkflow,
    engine: Any,
    problems: list[dict],
    *,
    group_size: int,
    max_concurrent: int,
    episode_timeout: float | None,
    switch_interval: float | None = None,
    rows_name: str = "problem",
) -> list:
    """`group_size` episodes per problem on an executor of their own: never training data.

    Sampling is whatever `workflow` and `engine` do: the greedy `/eval` proxy and a GreedyEngine
    for greedy evaluation, the training proxy and engine for pass@k samples. A rejected episode's
    reason names its row as `rows_name` and its index in `problems` ("held-out row 3").
    """
    executor = RolloutExecutor(
        workflow,
        engine,
        group_size=group_size,
        batch_size=len(problems),
        max_head_offpolicyness=0,
        max_concurrent=max(max_concurrent, group_size),
        episode_timeout=episode_timeout,
        switch_interval=switch_interval,
    )
    position = {id(problem): i for i, problem in enumerate(problems)}
    executor.describe_row = lambda row: f"{rows_name} {position[id(row)]}" if id(row) in position else None
    for problem in problems:
        executor.submit(problem)  # explicit: started as concurrency allows, at the current version
    try:
        groups = await executor.wait_groups(len(problems))
    except BaseException:
        await executor.cancel_all()
        raise
    return [ep for group in groups for ep in group]


def summarize(batch: RolloutBatch) -> EvalResult:
    n = len(batch.episodes)
    returns, first_ok, any_ok = [], 0, 0
    for i, ep in enumerate(batch.episodes):
        if not ep.accepted:
            continue
        calls = batch.calls(i)  # in the order they were made
        rewards = [_raw_reward(c) for c in calls]
        returns.append(batch.episode_return(i))
        first_ok += bool(rewards) and rewards[0] > 0
        any_ok += any(r > 0 for r in rewards)
    agent_rewards = batch.agent_reward_means()
    return EvalResult(
        agent_rewards=agent_rewards if len(agent_rewards) > 1 else {},
        reward_mean=sum(returns) / len(returns) if returns else math.nan,
        accuracy=first_ok / n if n else math.nan,
        agent_accuracy=any_ok / n if n else math.nan,
        n=n,
        rejected=len(batch.rejected),
        version=batch.version,
        batch=batch,
    )


def _raw_reward(call: Any) -> float:
    raw = getattr(call, "raw_reward", None)
    value = raw if raw is not None else call.reward
    return float(value or 0.0)


def pass_at_k(samples: RolloutBatch, k: int) -> float:
    """The share of problems (groups of `k` episodes) with at least one successful episode."""
    by_group: dict[int, bool] = {}
    for i, ep in enumerate(samples.episodes):
        ok = ep.accepted and any(_raw_reward(c) > 0 for c in samples.calls(i))
        by_group[ep.group_id] = by_group.get(ep.group_id, False) or ok
    solved = list(by_group.values())
    return sum(solved) / len(solved) if solved else math.nan


async def evaluate(
    problems: list[dict],
    *,
    rows_name: str,
    pass_k: int | None,
    max_concurrent: int,
    episode_timeout: float | None,
    switch_interval: float | None,
    engine: InferenceEngine,
    eval_workflow: RolloutWorkflow,
    sample_workflow: RolloutWorkflow,
    make_batch: Callable[[list], RolloutBatch],
) -> EvalResult:
    """`Session.evaluate()`'s episodes on `problems`: greedy with `eval_workflow`, and with
    `pass_k` also k sampled episodes per problem with `sample_workflow` (the training one)."""
    if pass_k is not None and (isinstance(pass_k, bool) or not isinstance(pass_k, int) or pass_k < 1):
        raise InvalidArgumentError(f"pass_k must be an int >= 1, got {pass_k!r}")
    limits: dict[str, Any] = dict(
        rows_name=rows_name,
        max_concurrent=max_concurrent,
        episode_timeout=episode_timeout,
        switch_interval=switch_interval,
    )
    result = summarize(make_batch(await run_greedy_episodes(eval_workflow, engine, problems, **limits)))
    if pass_k is None:
        return result
    samples = make_batch(await run_episodes(sample_workflow, engine, problems, group_size=pass_k, **limits))
    return dataclasses.replace(
        result,
        k=pass_k,
        pass_at_k=pass_at_k(samples, pass_k),
        sampled_accuracy=summarize(samples).accuracy,
        samples=samples,
    )


def choose_problems(
    problems: Any, n: int | None, held_out: list[dict], *, picklable: bool
) -> tuple[list[dict], str]:
    """The rows `evaluate(n, problems=...)` runs on and what a rejection calls them: `problems`
    in any form a dataset may take (checked like one), or the held-out split; the first `n`."""
    rows_name = "held-out row" if problems is None else "problems row"
    if problems is not None:
        problems = load_rows(problems, name="problems")
        if problems:
            check_rows(problems, name="problems", picklable=picklable)
    chosen = list(held_out if problems is None else problems)[: n or None]
    if not chosen:
        raise InvalidArgumentError(
            "evaluate() needs at least one problem: this dataset has no held-out rows; pass "
            "eval_dataset=..., set data.eval_fraction, or call evaluate(problems=rows)"
        )
    return chosen, rows_name

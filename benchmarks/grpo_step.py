"""GRPO step cost and where it goes: the multi-turn demo step against the single-turn step.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/grpo_step.py [--steps 4] [--http] [--only multi single multi_nocache]

Both run through a Session on `configs/multi_turn_math.yaml` (16 prompts x 8 samples, 16 new
tokens): "multi" is the demo (MultiTurnMathAgent, up to 2 turns, concat rows), "single" is
`benchmarks/grpo_vs_trl.py`'s one-call agent. `--http` sends inline agents over loopback HTTP
like external ones (the path before in-process episodes), to measure what that costs.
"multi_nocache" (run only when named in `--only`) is "multi" with the engine's prefix cache off
(`engine.prefix_cache_tokens=0`): every turn prefills its whole prompt again.

The setups' Sessions are open together and take their steps in turn (a step of each, then the
next of each), so a change of load on a shared machine hits them alike.

Per step (median over the steps after the first, which warms up):
- rollout: wall time; `engine_busy_s` the engine worker's time inside decode steps (the rest of
  the wall the engine waited on agents, proxy and lifecycle); per call `capture_ms` (the proxy's
  chat-completion function, engine wait included) and `engine_ms` (the engine's `agenerate`
  latency); per episode `episode_ms` (whole workflow episode), `agent_ms` (the agent's `run`:
  SDK, transport, proxy, engine, reward) and `lifecycle_ms` (grant/start/reward/end/export =
  episode - agent). Latencies of concurrent episodes overlap: they say where one episode waits,
  not how the wall time splits.
- train: `to_tensors_s`, `recompute_s` (log-prob recomputation), `forward_s`, `backward_s`,
  `optimizer_s`, `push_s` (weights to the engine); `train_s` is their wall total.
- prefill (LocalEngine only): `prefix_hit_rate`, the share of engine calls whose prompt continued
  a cached sequence; `prefill_saved`, the share of prompt tokens loaded from the prefix cache
  instead of computed; `prefill_positions`, positions the prefill forwards computed.
- `cpu_s`: the process CPU time of the step (all threads); on a shared machine the figure that
  still compares the work (run with `OMP_NUM_THREADS=1` there: spinning OpenMP threads count).
- tokens: `trained_tokens`, the positions the training forward computed (the actor's
  `train_positions`: with `actor.pack` the nodes of the packed tries, padding nodes included;
  without it the padded rows), over `unique_tokens` (distinct prefixes of the batch's rows: one
  trie over all of them, as `benchmarks/train_tokens.py` counts); `row_tokens` is what training
  on every row unshared would compute (the rows' non-padding tokens).

With both "multi" and "single", the decomposition: multi / single per phase (wall and CPU), the
work ratios (`unique_tokens`; `generated_tokens`, the loss-mask tokens; engine positions,
`prefill_positions` + generated; engine calls), the step's ratio per unit of each, and what the
target would need with this work: the cost per unique / generated token, and the rollout time
left beside the measured train phase.

The last line is one JSON object with both setups, `multi_over_single` (target <= 1.5) and
`decomposition`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG = ROOT / "configs" / "multi_turn_math.yaml"
SETUPS = {
    "multi": [],
    "single": [
        "agent.workflow=benchmarks.grpo_vs_trl.SingleTurnMathAgent",
        "agent.workflow_kwargs={}",
        "agent.chat_template_type=hf",
        "agent.export_style=individual",
    ],
    "multi_nocache": ["engine.prefix_cache_tokens=0"],
}
DEFAULT_SETUPS = ("multi", "single")


def engine_counters(engine: Any) -> dict[str, int]:
    stats = getattr(engine, "stats", None)
    keys = ("prompt_tokens", "prefix_cache_hits", "prefix_cache_tokens", "prefill_positions")
    return {k: int(getattr(stats, k, 0)) for k in keys}


class Timers:
    """Seconds and calls per phase, from wrapped functions (sync or async)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name, None)
        if original is None:  # renamed by a later change: that phase reads 0
            print(f"# no {type(owner).__name__}.{name}: phase {phase!r} not timed", file=sys.stderr)
            return
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def timed(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._add(phase, start)
        else:

            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self._add(phase, start)

        setattr(owner, name, timed)

    def _add(self, phase: str, start: float) -> None:
        self.seconds[phase] += time.perf_counter() - start
        self.calls[phase] += 1

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        out = dict(self.seconds), dict(self.calls)
        self.seconds.clear()
        self.calls.clear()
        return out


TIMERS = Timers()


@functools.cache
def instrument_modules() -> None:
    """Wrap module- and class-level entry points, once per process (benchmark only). The proxy
    app imports `create_chat_completion` when it is built, so this runs before the Session."""
    import torch

    import areal_nb.capture.chat as chat
    import areal_nb.train.actor_forward as actor_forward
    from areal_nb.rollout.batch import RolloutBatch

    TIMERS.wrap(chat, "create_chat_completion", "capture")
    TIMERS.wrap(RolloutBatch, "to_tensors", "to_tensors")
    TIMERS.wrap(actor_forward, "compute_token_logprobs_and_entropy", "forward")  # padded rows
    TIMERS.wrap(actor_forward, "packed_token_logprobs_and_entropy", "forward")  # packed tries (actor.pack)
    TIMERS.wrap(torch.Tensor, "backward", "backward")


def instrument_session(session: Any, timers: Timers) -> None:
    """Wrap the live objects' phase methods."""
    timers.wrap(session.engine, "agenerate", "engine")
    if hasattr(session.engine, "_step"):  # LocalEngine's decode step, on its worker thread
        timers.wrap(session.engine, "_step", "engine_busy")
    workflow = session.workflow
    inner = getattr(workflow, "workflow", workflow)  # a GroupedRolloutWorkflow wraps the proxy workflow
    timers.wrap(inner, "arun_episode", "episode")
    timers.wrap(inner, "_run_agent", "agent")
    timers.wrap(session.actor, "_logprobs_no_grad", "recompute")
    timers.wrap(session.actor.optimizer, "step", "optimizer")
    timers.wrap(session.actor, "push_weights", "push")


def run_setups(names: list[str], steps: int, overrides: list[str], http: bool) -> dict[str, dict[str, Any]]:
    """Each setup's medians. The setups' Sessions are open together and take their steps in turn
    (step 0 of each, then step 1 of each, ...): on a shared machine a change of load hits them
    alike, and the ratios compare steps taken seconds apart (an idle Session's engine sleeps)."""
    from areal_nb.config import load_config
    from areal_nb.session import Session, builder

    builder.IN_PROCESS_AGENTS = not http
    instrument_modules()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for name in names:
            cfg = load_config(
                CONFIG,
                [
                    *SETUPS[name],
                    *overrides,
                    "logging.progress=false",
                    "logging.eval_every=0",
                    "rollout.prefetch=false",
                ],
            )
            sessions[name] = stack.enter_context(Session(cfg))
            instrument_session(sessions[name], TIMERS)
        for step in range(steps):
            for name, session in sessions.items():
                row = run_step(name, step, session, TIMERS)
                rows[name].append(row)
                print(
                    json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                    flush=True,
                )
    return {name: medians(setup_rows) for name, setup_rows in rows.items()}


def run_step(name: str, step: int, session: Any, timers: Timers) -> dict[str, Any]:
    """One rollout and train step of `session`, timed by phase."""
    from areal_nb.train.packing import count_unique_tokens

    timers.take()
    cpu0 = time.process_time()
    counters0 = engine_counters(session.engine)
    t0 = time.perf_counter()
    batch = session.rollout()
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    rollout_s, rollout_n = timers.take()
    counters = {k: v - counters0[k] for k, v in engine_counters(session.engine).items()}
    stats = session.train_step(batch)
    t2 = time.perf_counter()
    cpu_s = time.process_time() - cpu0
    train_s, _ = timers.take()
    calls = max(rollout_n.get("capture", 0), 1)
    episodes = max(rollout_n.get("episode", 0), 1)
    tensors = batch.to_tensors().tensors()
    return {
        "setup": name,
        "step": step,
        "step_s": t2 - t0,
        "cpu_s": cpu_s,
        "rollout_s": t1 - t0,
        "train_s": t2 - t1,
        "rollout_cpu_s": cpu1 - cpu0,
        "train_cpu_s": cpu_s - (cpu1 - cpu0),
        "engine_busy_s": rollout_s.get("engine_busy", float("nan")),
        "calls_per_episode": calls / episodes,
        "capture_ms": 1e3 * rollout_s.get("capture", 0.0) / calls,
        "engine_ms": 1e3 * rollout_s.get("engine", 0.0) / calls,
        "episode_ms": 1e3 * rollout_s.get("episode", 0.0) / episodes,
        "agent_ms": 1e3 * rollout_s.get("agent", 0.0) / episodes,
        "lifecycle_ms": 1e3 * (rollout_s.get("episode", 0.0) - rollout_s.get("agent", 0.0)) / episodes,
        "prefix_hit_rate": counters["prefix_cache_hits"] / calls,
        "prefill_saved": counters["prefix_cache_tokens"] / max(counters["prompt_tokens"], 1),
        "prefill_positions": counters["prefill_positions"],
        **{
            f"{k}_s": train_s.get(k, 0.0)
            for k in ("to_tensors", "recompute", "forward", "backward", "optimizer", "push")
        },
        "trained_tokens": int(stats["train_positions"]),
        "unique_tokens": count_unique_tokens(tensors["input_ids"], tensors["attention_mask"]),
        "row_tokens": int(tensors["attention_mask"].sum()),
        "generated_tokens": int((tensors["loss_mask"].bool() & tensors["attention_mask"].bool()).sum()),
        "engine_calls": calls,
        "reward_mean": stats.get("reward_mean"),
    }


def medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the steps after the first (warm-up), and the token ratios over their sums."""
    measured = rows[1:] or rows
    med = {
        k: statistics.median(r[k] for r in measured)
        for k in rows[0]
        if isinstance(rows[0][k], int | float) and k != "step"
    }
    unique = sum(r["unique_tokens"] for r in measured)
    med["trained_over_unique"] = sum(r["trained_tokens"] for r in measured) / unique
    med["rows_over_unique"] = sum(r["row_tokens"] for r in measured) / unique  # without prefix sharing
    return med


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4, help="steps per setup; the first is warm-up")
    parser.add_argument("--http", action="store_true", help="inline agents over loopback HTTP (the old path)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=tuple(SETUPS),
        default=list(DEFAULT_SETUPS),
        help=f"setups to run (default: {' '.join(DEFAULT_SETUPS)})",
    )
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for both setups, e.g. rollout.batch_size=8"
    )
    args = parser.parse_args()

    result: dict[str, Any] = {"transport": "http" if args.http else "in-process"}
    result |= run_setups(
        [name for name in SETUPS if name in args.only], args.steps, args.overrides, args.http
    )
    for name in SETUPS:
        if name in result:
            m = result[name]
            print(
                f"{name:>6}: {m['step_s']:.2f} s/step = rollout {m['rollout_s']:.2f} (engine busy "
                f"{m['engine_busy_s']:.2f}) + train {m['train_s']:.2f} (recompute {m['recompute_s']:.2f}, "
                f"forward {m['forward_s']:.2f}, backward {m['backward_s']:.2f}, optimizer {m['optimizer_s']:.2f}, "
                f"push {m['push_s']:.2f}); per episode {m['episode_ms']:.0f} ms (agent {m['agent_ms']:.0f}, "
                f"lifecycle {m['lifecycle_ms']:.1f}); per call capture {m['capture_ms']:.0f} ms, engine "
                f"{m['engine_ms']:.0f} ms; prefix cache hits {m['prefix_hit_rate']:.0%} of calls, "
                f"{m['prefill_saved']:.0%} of prompt tokens not prefilled; trained/unique tokens "
                f"{m['trained_over_unique']:.2f} (unshared rows would be {m['rows_over_unique']:.2f})"
            )
    if "multi" in result and "multi_nocache" in result:
        result["multi_over_nocache"] = result["multi"]["step_s"] / result["multi_nocache"]["step_s"]
        print(
            f"multi-turn step with / without the prefix cache: {result['multi_over_nocache']:.2f}x; rollout "
            f"{result['multi']['rollout_s'] / result['multi_nocache']['rollout_s']:.2f}x; load average "
            f"{os.getloadavg()[0]:.1f}"
        )
    if "multi" in result and "single" in result:
        result["multi_over_single"] = result["multi"]["step_s"] / result["single"]["step_s"]
        result["multi_over_single_cpu"] = result["multi"]["cpu_s"] / result["single"]["cpu_s"]
        print(
            f"multi-turn / single-turn step: {result['multi_over_single']:.2f}x (target <= 1.5); CPU time per "
            f"step {result['multi_over_single_cpu']:.2f}x; load average {os.getloadavg()[0]:.1f}"
        )
        result["decomposition"] = decomposition(result["multi"], result["single"])
    print(json.dumps(result))


TARGET = 1.5
# The work a step does, per setup (medians per step): what training computes (unique tokens of the
# batch's trie), what the policy samples (generated tokens), what the engine computes (prefilled
# positions + generated tokens) and the engine calls (sequential turns per episode).
WORK = {
    "unique": "unique_tokens",
    "generated": "generated_tokens",
    "engine_positions": ("prefill_positions", "generated_tokens"),
    "calls": "engine_calls",
}


def decomposition(multi: dict[str, float], single: dict[str, float]) -> dict[str, float]:
    """multi / single per phase, per unit of work, and what the target would need; printed."""

    def work(m: dict[str, float], key: str | tuple[str, ...]) -> float:
        return sum(m[k] for k in ((key,) if isinstance(key, str) else key))

    out = {
        f"{phase}_ratio": multi[f"{phase}_s"] / single[f"{phase}_s"] for phase in ("step", "rollout", "train")
    }
    out |= {
        f"{phase}_cpu_ratio": multi[f"{phase}_cpu_s"] / single[f"{phase}_cpu_s"]
        for phase in ("rollout", "train")
    }
    out |= {f"work_{name}_ratio": work(multi, key) / work(single, key) for name, key in WORK.items()}
    # < 1: multi does a unit of that work cheaper than single does
    out["step_per_unique_ratio"] = out["step_ratio"] / out["work_unique_ratio"]
    out["step_per_generated_ratio"] = out["step_ratio"] / out["work_generated_ratio"]
    out["train_per_unique_ratio"] = out["train_ratio"] / out["work_unique_ratio"]
    out["rollout_per_engine_position_ratio"] = out["rollout_ratio"] / out["work_engine_positions_ratio"]
    out["rollout_per_generated_ratio"] = out["rollout_ratio"] / out["work_generated_ratio"]
    # the target with this work: the cost per unit it needs, and the rollout it leaves beside this train
    budget = TARGET * single["step_s"]
    out["needed_step_per_unique_ratio"] = TARGET / out["work_unique_ratio"]
    out["needed_step_per_generated_ratio"] = TARGET / out["work_generated_ratio"]
    out["rollout_budget_s"] = budget - multi["train_s"]
    print(
        f"multi / single: step {out['step_ratio']:.2f}x = rollout {out['rollout_ratio']:.2f}x "
        f"({multi['rollout_s']:.2f} vs {single['rollout_s']:.2f} s; CPU {out['rollout_cpu_ratio']:.2f}x) and train "
        f"{out['train_ratio']:.2f}x ({multi['train_s']:.2f} vs {single['train_s']:.2f} s; CPU "
        f"{out['train_cpu_ratio']:.2f}x)"
    )
    print(
        f"work multi / single: unique (trained) tokens {out['work_unique_ratio']:.2f}x "
        f"({multi['unique_tokens']:.0f} vs {single['unique_tokens']:.0f}), generated tokens "
        f"{out['work_generated_ratio']:.2f}x ({multi['generated_tokens']:.0f} vs {single['generated_tokens']:.0f}), "
        f"engine positions (prefilled + generated) {out['work_engine_positions_ratio']:.2f}x, engine calls "
        f"{out['work_calls_ratio']:.2f}x ({multi['calls_per_episode']:.2f} sequential per episode)"
    )
    print(
        f"per unit of work, multi / single: step per unique token {out['step_per_unique_ratio']:.2f}x, per "
        f"generated token {out['step_per_generated_ratio']:.2f}x; train per unique token "
        f"{out['train_per_unique_ratio']:.2f}x; rollout per engine position "
        f"{out['rollout_per_engine_position_ratio']:.2f}x, per generated token {out['rollout_per_generated_ratio']:.2f}x"
    )
    print(
        f"target <= {TARGET}x with this work: the multi step may cost {out['needed_step_per_unique_ratio']:.2f}x "
        f"single's per unique token (now {out['step_per_unique_ratio']:.2f}x) and "
        f"{out['needed_step_per_generated_ratio']:.2f}x per generated token (now "
        f"{out['step_per_generated_ratio']:.2f}x); beside this train ({multi['train_s']:.2f} s) it leaves the "
        f"rollout {out['rollout_budget_s']:.2f} s = {out['rollout_budget_s'] / single['rollout_s']:.2f}x single's "
        f"rollout, for {out['work_engine_positions_ratio']:.2f}x its engine positions in "
        f"{multi['calls_per_episode']:.2f} sequential calls per episode"
    )
    return out


if __name__ == "__main__":
    main()

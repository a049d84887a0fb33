"""The Session: engine, proxy, rollouts and GRPO training inside one notebook kernel.

Threads (DESIGN.md §3): the engine decodes in its own worker thread; the proxy server runs
uvicorn in its own thread; one background thread runs the Session's asyncio loop, where the
rollout executor and the agents' HTTP clients live. Notebook methods are sync facades over
that loop (`rollout`, `train_step`, `run`, ...), with `a`-prefixed async twins for `await`.
Training runs in the calling thread.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import dataclasses
import json
import logging
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from areal_nb.config import ConfigError, SessionConfig, dump_config, load_config, to_dict
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import RolloutExecutor

logger = logging.getLogger(__name__)

_LIVE_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def _flatten_overrides(overrides: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`rollout={"batch_size": 4}` or `rollout__batch_size=4` → {"rollout.batch_size": 4}.

    Values stay Python objects, so an agent instance or class can be passed as
    `agent__workflow=MyAgent()`. A dict value for `workflow_kwargs` is kept whole.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        path = prefix + key.replace("__", ".")
        if isinstance(value, dict) and value and not path.endswith("workflow_kwargs"):
            out.update(_flatten_overrides(value, path + "."))
        else:
            out[path] = value
    return out


class _DataStream:
    """An endless, seeded stream of training prompts whose position can be saved."""

    def __init__(self, cfg: SessionConfig, pos: int = 0) -> None:
        from areal_nb.data import generate_problems, load_gsm8k

        self.cfg = cfg
        self.pos = 0
        if cfg.data.source == "generated":
            self._chunk = lambda k: generate_problems(512, seed=cfg.data.seed * 100_003 + k, split="train",
                                                      config=cfg.data.task)
        else:
            items = load_gsm8k(cfg.data.source, split="train")
            if not items:
                raise ConfigError(f"data.source {cfg.data.source!r} holds no problems")

            def chunk(k: int) -> list[dict]:
                order = list(items)
                random.Random(cfg.data.seed * 100_003 + k).shuffle(order)
                return order

            self._chunk = chunk
        self._buffer: list[dict] = []
        self._chunk_index = 0
        for _ in range(pos):
            next(self)

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if not self._buffer:
            self._buffer = list(reversed(self._chunk(self._chunk_index)))
            self._chunk_index += 1
        self.pos += 1
        return self._buffer.pop()


class Session:
    """`Session(config | yaml_path | None, **overrides)`; see the README for a tour.

    Overrides are dotted keys written with `__` (`actor__lr=1e-5`) or section dicts
    (`rollout={"batch_size": 4}`).
    """

    def __init__(self, config: SessionConfig | str | Path | dict | None = None, *, start: bool = True,
                 **overrides: Any) -> None:
        self.config: SessionConfig = load_config(config, _flatten_overrides(overrides))
        self.step_count = 0
        self.version = 0
        self._history: list[dict[str, Any]] = []
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._started = False
        self._closed = False
        self.last_batch: RolloutBatch | None = None
        self._resume_state: dict[str, Any] | None = None
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Session:
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("this Session is closed; create a new one")
        cfg = self.config
        from areal_nb.data import generate_problems
        from areal_nb.engine import LocalEngine
        from areal_nb.models import load_model, load_tokenizer
        from areal_nb.openai import CompletionSettings
        from areal_nb.proxy import ProxyServer, ProxySettings, create_app
        from areal_nb.train import Actor

        if cfg.engine.type != "local":
            raise ConfigError(f"engine.type={cfg.engine.type!r} is not available in this build; use 'local'")
        self._seed_everything(cfg.seed)
        device = cfg.model.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, cfg.model.dtype)
        self.tokenizer = load_tokenizer(cfg.model.path)
        policy = load_model(cfg.model.path, dtype=dtype, device=device)
        self.engine = LocalEngine(policy, self.tokenizer, device=device, dtype=dtype,
                                  max_batch_size=cfg.engine.max_batch_size, seed=cfg.engine.seed)
        actor_cfg = cfg.actor
        if actor_cfg.lr_schedule != "constant" and actor_cfg.lr_decay_steps is None:
            actor_cfg = dataclasses.replace(actor_cfg, lr_decay_steps=cfg.total_steps)  # the run's length
        self.actor = Actor(policy, actor_cfg, version=0)
        self.admin_key = cfg.agent.admin_api_key or secrets.token_urlsafe(24)
        completion = CompletionSettings(chat_template_type=cfg.agent.chat_template_type,
                                        engine_max_tokens=getattr(self.engine, "max_context", None))
        self._proxy_settings = ProxySettings(admin_api_key=self.admin_key, session_timeout=cfg.agent.session_timeout,
                                             completion=completion)
        self.app = create_app(self.engine, self.tokenizer, self._proxy_settings)
        self.proxy = ProxyServer(self.app, host=cfg.agent.host, port=cfg.agent.port)
        self.proxy.start()
        self.proxy_url = self.proxy.url

        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="areal-nb-session-loop",
                                             daemon=True)
        self._loop_thread.start()
        self.workflow = self._resolve_workflow()
        self.executor = self._call(self._make_executor())
        self.eval_problems = generate_problems(cfg.data.eval_size, seed=0, split="test", config=cfg.data.task)
        self.data = _DataStream(cfg)
        self._started = True
        _LIVE_SESSIONS.add(self)
        if self._resume_state is not None:
            self._apply_resume_state(self._resume_state)
        return self

    async def _make_executor(self) -> RolloutExecutor:
        cfg = self.config
        return RolloutExecutor(self.workflow, self.engine, group_size=cfg.rollout.group_size,
                               batch_size=cfg.rollout.batch_size,
                               max_head_offpolicyness=cfg.rollout.max_head_offpolicyness,
                               max_concurrent=cfg.rollout.max_concurrent_rollouts,
                               episode_timeout=cfg.agent.agent_timeout)

    def _resolve_workflow(self):
        import inspect

        from areal_nb.rollout.resolve import resolve_workflow, import_from_string

        cfg = self.config
        target = cfg.agent.workflow
        if isinstance(target, str):
            target = import_from_string(target)
        kwargs = dict(cfg.agent.workflow_kwargs)
        if inspect.isclass(target):
            params = inspect.signature(target).parameters
            offered = {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p,
                       "max_completion_tokens": cfg.rollout.max_new_tokens,
                       "max_new_tokens": cfg.rollout.max_new_tokens, "tokenizer": self.tokenizer,
                       "turn_discount": cfg.agent.turn_discount, "export_style": "individual",
                       "chat_template_type": cfg.agent.chat_template_type}
            for name, value in offered.items():
                if name in params and name not in kwargs:
                    kwargs[name] = value
        return resolve_workflow(target, kwargs, group_size=1, proxy_addr=self.proxy_url,
                                admin_api_key=self.admin_key, mode=cfg.agent.mode,
                                discount=cfg.agent.turn_discount, export_style="individual",
                                discount_mode=cfg.agent.discount_mode)

    def close(self) -> None:
        """Stop rollouts, the proxy, the engine and the loop thread. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        try:
            self._call(self.executor.cancel_all(), timeout=30)
        except Exception as e:  # closing must go on
            logger.warning("cancelling rollouts failed: %s", e)
        close_wf = getattr(self.workflow, "aclose", None)
        try:
            if close_wf is not None:
                self._call(close_wf(), timeout=30)
            elif hasattr(self.workflow, "close"):
                self.workflow.close()
        except Exception as e:
            logger.warning("closing the workflow failed: %s", e)
        self.proxy.stop()
        self.engine.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)
        self._loop.close()
        _LIVE_SESSIONS.discard(self)

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ plumbing
    def _call(self, coro, timeout: float | None = None):
        """Run a coroutine on the session loop from a cell; Ctrl-C cancels it cleanly."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except KeyboardInterrupt:
            future.cancel()
            try:
                asyncio.run_coroutine_threadsafe(self.executor.cancel_all(), self._loop).result(30)
            except Exception as e:
                logger.warning("cleanup after interrupt failed: %s", e)
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Session is closed; create a new one")
        if not self._started:
            self.start()

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:
            pass

    def add_step_callback(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """`fn(stats)` runs after every training step (the dashboard uses this)."""
        self._callbacks.append(fn)

    @property
    def history(self):
        import pandas as pd

        return pd.DataFrame.from_records(self._history)

    def proxy_caches(self) -> dict[str, Any]:
        """The live InteractionCache of every session currently open in the proxy."""
        state = getattr(self.app.state, "proxy", None) or getattr(self.app.state, "areal", None)
        sessions = getattr(state, "sessions", {}) if state is not None else {}
        return {sid: getattr(s, "cache", None) or getattr(s, "completions", None) for sid, s in dict(sessions).items()}

    # ------------------------------------------------------------------ rollout
    async def arollout(self, n_prompts: int | None = None) -> RolloutBatch:
        self._check_open()
        n = n_prompts or self.config.rollout.batch_size
        start = time.perf_counter()
        missing = n - self.executor.n_waiting
        for _ in range(max(0, missing)):
            self.executor.submit(next(self.data))
        groups = await self.executor.wait_groups(n)
        episodes = [ep for group in groups for ep in group]
        batch = RolloutBatch(episodes, style=self.config.agent.export_style, discount=self.config.agent.turn_discount,
                             discount_mode=self.config.agent.discount_mode, version=self.engine.get_version(),
                             tokenizer=self.tokenizer)
        elapsed = time.perf_counter() - start
        out_tokens = sum(c.model_response.output_len for i, ep in enumerate(episodes) if ep.accepted
                         for c in batch.calls(i) if c.model_response is not None)
        returns = [batch.episode_return(i) for i, ep in enumerate(episodes) if ep.accepted]
        batch.stats.update({
            "rollout_s": elapsed,
            "episodes": len(episodes),
            "rejected": len(batch.rejected),
            "reward_mean": sum(returns) / len(returns) if returns else float("nan"),
            "generated_tokens": out_tokens,
            "rollout_tokens_per_s": out_tokens / elapsed if elapsed > 0 else float("nan"),
        })
        self.last_batch = batch
        return batch

    def rollout(self, n_prompts: int | None = None) -> RolloutBatch:
        """Run `n_prompts` × `group_size` episodes (default: rollout.batch_size prompts).

        Groups already generated in the background by `run()` come first (they are within
        `max_head_offpolicyness`); new ones are generated now, at the current policy version.
        """
        self._check_open()
        return self._call(self.arollout(n_prompts))

    # ------------------------------------------------------------------ training
    def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One GRPO update on `batch`; the new weights go to the engine as version + 1."""
        self._check_open()
        tensors = batch.to_tensors()
        stats = dict(self.actor.train_step(tensors, tensors["group_ids"]))
        self.version = self.actor.version
        self.actor.push_weights(self.engine, self.version)
        self._loop.call_soon_threadsafe(self.executor.on_version_change)
        self.step_count += 1
        row = {"step": self.step_count}
        row.update(batch.stats)
        row.update(stats)
        row["version"] = self.version  # the version the engine serves after this step
        row.setdefault("eval_accuracy", float("nan"))
        self._history.append(row)
        for fn in list(self._callbacks):
            try:
                fn(row)
            except Exception as e:  # a broken widget must not stop training
                logger.warning("step callback %r failed: %s", fn, e)
        return row

    async def atrain_step(self, batch: RolloutBatch) -> dict[str, float]:
        return await asyncio.to_thread(self.train_step, batch)

    def step(self) -> dict[str, float]:
        """Rollout + train."""
        return self.train_step(self.rollout())

    def run(self, steps: int | None = None, *, progress: bool | None = None) -> Any:
        """Train for `steps` steps, rollouts running ahead within the staleness bound."""
        from tqdm.auto import tqdm

        self._check_open()
        cfg = self.config
        steps = cfg.total_steps if steps is None else steps
        show = cfg.logging.progress if progress is None else progress
        if cfg.rollout.prefetch:
            self._loop.call_soon_threadsafe(self.executor.set_feeder, self.data)
        bar = tqdm(total=steps, desc="GRPO", disable=not show)
        try:
            for _ in range(steps):
                row = self.step()
                if cfg.logging.eval_every and self.step_count % cfg.logging.eval_every == 0:
                    row["eval_accuracy"] = self._history[-1]["eval_accuracy"] = self.evaluate()
                if cfg.checkpoint.save_dir and cfg.checkpoint.save_every and \
                        self.step_count % cfg.checkpoint.save_every == 0:
                    self.save(Path(cfg.checkpoint.save_dir) / f"step{self.step_count}")
                bar.update(1)
                bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.3f}", loss=f"{row.get('loss', 0):.4f}")
        finally:
            bar.close()
            if cfg.rollout.prefetch and not self._closed:
                self._loop.call_soon_threadsafe(self.executor.set_feeder, None)
        return self.history

    def evaluate(self, n: int | None = None, max_new_tokens: int | None = None, turns: int = 1) -> float:
        """Greedy accuracy of the current policy on the held-out split.

        `turns=1`: the first reply alone. `turns=k`: the seed's multi-turn agent loop, greedy —
        a wrong answer gets the fixed correction prompt and another try, up to k replies; the
        score is the fraction solved within k (what the multi-turn agent is trained for).
        """
        from areal_nb.data import CORRECTION_PROMPT, score_answer
        from areal_nb.models.evaluation import generate_replies

        self._check_open()
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        problems = self.eval_problems[: n or len(self.eval_problems)]
        model = self.actor.model
        was_training = model.training
        model.eval()
        try:
            conversations = [list(p["messages"]) for p in problems]
            solved = [False] * len(problems)
            for _ in range(turns):
                todo = [i for i, ok in enumerate(solved) if not ok]
                if not todo:
                    break
                replies = generate_replies(model, self.tokenizer, [conversations[i] for i in todo],
                                           max_new_tokens=max_new_tokens or self.config.rollout.max_new_tokens)
                for i, reply in zip(todo, replies, strict=True):
                    if score_answer(reply, problems[i]["answer_value"]) > 0:
                        solved[i] = True
                    else:
                        conversations[i] += [{"role": "assistant", "content": reply},
                                             {"role": "user", "content": CORRECTION_PROMPT}]
            return sum(solved) / len(solved)
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> Path:
        """Model, optimizer, step, version, RNG states, data position, config and history."""
        self._check_open()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.actor.model.save_pretrained(path / "model")
        self.tokenizer.save_pretrained(path / "model")
        cfg = copy.deepcopy(self.config)
        cfg.model.path = str((path / "model").resolve())
        if not isinstance(cfg.agent.workflow, str):
            raise ConfigError("save() needs agent.workflow as an import string so the run can be restored")
        dump_config(cfg, path / "config.yaml")
        state = {
            "step_count": self.step_count,
            "version": self.version,
            "actor": self.actor.state_dict(),
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
            "engine_rng": self.engine.rng_state() if hasattr(self.engine, "rng_state") else None,
            "data_pos": self.data.pos,
        }
        torch.save(state, path / "state.pt")
        (path / "history.json").write_text(json.dumps(self._history, default=float))
        return path

    @classmethod
    def load(cls, path: str | Path, **overrides: Any) -> Session:
        """A Session that continues the saved run."""
        path = Path(path)
        if not (path / "state.pt").exists():
            raise FileNotFoundError(f"{path} is not a Session checkpoint (no state.pt)")
        session = cls(path / "config.yaml", start=False, **overrides)
        session._resume_state = torch.load(path / "state.pt", weights_only=False)
        session._resume_state["history"] = json.loads((path / "history.json").read_text())
        session.start()
        return session

    def _apply_resume_state(self, state: dict[str, Any]) -> None:
        self.step_count = state["step_count"]
        self.version = state["version"]
        self.actor.load_state_dict(state["actor"])
        self.actor.version = self.version
        self.actor.push_weights(self.engine, self.version)
        self.engine.set_version(self.version)
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])
        if state.get("engine_rng") is not None and hasattr(self.engine, "set_rng_state"):
            self.engine.set_rng_state(state["engine_rng"])
        self.data = _DataStream(self.config, pos=state["data_pos"])
        self._history = list(state.get("history", []))
        self._resume_state = None

    # ------------------------------------------------------------------ widgets
    def dashboard(self):
        from areal_nb.widgets import Dashboard

        return Dashboard(self)

    def __repr__(self) -> str:
        status = "closed" if self._closed else ("running" if self._started else "not started")
        return (f"Session({status}, model={self.config.model.path!r}, step={self.step_count}, "
                f"version={self.version}, proxy={getattr(self, 'proxy_url', None)!r})")


@atexit.register
def _close_all_sessions() -> None:
    for session in list(_LIVE_SESSIONS):
        try:
            session.close()
        except Exception:
            pass

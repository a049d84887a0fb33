"""The run's progress as one value: what a checkpoint saves and restores besides the tensors.

The actor owns the policy version and the count of training steps (`Actor.version`,
`Actor.steps_done`); the Session reads them there. A checkpoint records them together with the
data position, the random generators' states and the stats history as a `RunState`, written into
state.pt under the keys earlier checkpoints used (`step_count`, `version`, `data_pos`, `rng`,
`engine_rng`; history in history.json), so checkpoints of either age load alike.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class RunState:
    version: int  # the policy version the engine serves
    steps: int  # training steps taken (drives the learning-rate schedule and run()'s cadence)
    data_pos: int  # the next training row, before any drawn and not yet trained on
    rng: dict[str, Any]  # Python's and torch's generator states
    engine_rng: Any = None  # the engine's sampling generator (None: an engine without one)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one stats row per step

    @classmethod
    def from_saved(cls, state: dict[str, Any]) -> RunState:
        """From state.pt's contents (plus `history`, as `read_checkpoint` returns them)."""
        return cls(
            version=int(state["version"]),
            steps=int(state["step_count"]),
            data_pos=int(state["data_pos"]),
            rng=state["rng"],
            engine_rng=state.get("engine_rng"),
            history=list(state.get("history", [])),
        )

    def saved(self) -> dict[str, Any]:
        """state.pt's keys for this state (history goes to history.json)."""
        return {
            "step_count": self.steps,
            "version": self.version,
            "rng": self.rng,
            "engine_rng": self.engine_rng,
            "data_pos": self.data_pos,
        }

    def restore_rngs(self) -> None:
        random.setstate(self.rng["python"])
        torch.set_rng_state(self.rng["torch"])


def untrained_data_pos(data: Callable[[], Any], executor: Any, runtime: Any) -> int:
    """The data position before the groups drawn and not handed out for training yet (fetched
    ahead by `run()` with `rollout.prefetch`): a resumed run generates them again, at its own
    version, instead of skipping their rows. Read on the Session's loop (`runtime`), where the
    executor draws rows, so the position and the waiting groups are one consistent state.
    `data()`: the Session's current `DataStream` (Ctrl-C may replace it)."""
    if executor is None or runtime is None:
        return data().pos

    def position() -> int:
        return data().pos - executor.n_waiting

    async def read() -> int:
        return position()

    return position() if runtime.on_loop() else runtime.call(read())  # (the loop never waits on itself)


def rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}

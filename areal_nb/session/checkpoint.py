"""Session checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint folder holds `model/` (weights + tokenizer, loadable by transformers),
`config.yaml` (the run's config, with `model.path` pointing at `model/`), `state.pt` (optimizer,
step, version, RNG states, data position), `history.json` (the stats rows so far), and `data/`
when the dataset was given as a Python object (its rows as JSONL; see `_store_python_datasets`).
"""

from __future__ import annotations

import copy
import json
import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_nb.config import ConfigError, dump_config
from areal_nb.data import load_rows, write_jsonl
from areal_nb.train.lora import lora_base, merged_weights

if TYPE_CHECKING:
    from .session import Session


def save_checkpoint(session: Session, path: str | Path, actor_state: dict[str, Any] | None = None,
                    ref_weights: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint folder (rank 0). `actor_state` / `ref_weights`: the actor's full state
    and its KL reference's full weights when the caller already gathered them (under FSDP every
    rank takes part in those gathers; see `Session.save`)."""
    path = Path(path)
    cfg = copy.deepcopy(session.config)
    if not isinstance(cfg.agent.workflow, str):
        raise ConfigError("save() needs agent.workflow as an import string so the run can be restored")
    path.mkdir(parents=True, exist_ok=True)
    _store_python_datasets(cfg.data, path / "data")
    actor_state = session.actor.state_dict() if actor_state is None else actor_state
    ref_weights = session.actor.ref_weights() if ref_weights is None else ref_weights
    # (a copy: save_pretrained drops tied weights' duplicate keys from the dict it is given)
    # LoRA: model/ is the frozen base; state.pt holds the adapters with the actor's state
    actor = session.actor
    model_weights = merged_weights(actor.model, adapters=False) if actor.lora else actor_state["model"]
    lora_base(session.actor.model).save_pretrained(path / "model", state_dict=dict(model_weights))
    session.tokenizer.save_pretrained(path / "model")
    cfg.model.path = str((path / "model").resolve())
    dump_config(cfg, path / "config.yaml")
    engine = session.engine
    state = {
        "step_count": session.step_count,
        "version": session.version,
        "actor": actor_state,
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        "engine_rng": engine.rng_state(),
        "data_pos": untrained_data_pos(session),
        # the KL reference is the run's *initial* policy, not the saved weights it restarts from
        "ref_model": ref_weights,  # full tensors (None without kl_ctl)
    }
    torch.save(state, path / "state.pt")
    (path / "history.json").write_text(json.dumps(session._history, default=float))
    return path


def untrained_data_pos(session: Session) -> int:
    """The data position before the groups drawn and not handed out for training yet (fetched
    ahead by `run()` with `rollout.prefetch`): a resumed run generates them again, at its own
    version, instead of skipping their rows. Read on the session's loop, where the executor draws
    rows, so the position and the waiting groups are one consistent state."""
    executor, runtime = session.executor, session._runtime  # noqa: SLF001
    if executor is None or runtime is None:
        return session.data.pos

    def position() -> int:
        return session.data.pos - executor.n_waiting

    async def read() -> int:
        return position()

    if threading.current_thread() is runtime._thread:  # noqa: SLF001 - on the loop already: no waiting on it
        return position()
    return runtime.call(read())


def _store_python_datasets(data_cfg: Any, folder: Path) -> None:
    """A dataset given as a Python object (list of dicts, DataFrame, datasets.Dataset) cannot go
    into config.yaml: its rows are written to `data/train.jsonl` / `data/eval.jsonl` in the
    checkpoint and the saved config points there (read back as rows, unchanged), so the
    checkpoint restores on its own. A path source stays a path (the file is not copied)."""
    for field, name in (("source", "train"), ("eval_source", "eval")):
        value = getattr(data_cfg, field)
        if value is None or isinstance(value, (str, Path)):
            continue
        rows = load_rows(value, name=f"data.{field}")
        setattr(data_cfg, field, str(write_jsonl(rows, folder / f"{name}.jsonl", name=f"data.{field}").resolve()))
        data_cfg.format = "rows"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The saved state (with its history); the config is loaded separately from config.yaml."""
    path = Path(path)
    if not (path / "state.pt").exists():
        raise FileNotFoundError(f"{path} is not a Session checkpoint (no state.pt)")
    state = torch.load(path / "state.pt", weights_only=False)
    state["history"] = json.loads((path / "history.json").read_text())
    return state


def restore(session: Session, state: dict[str, Any]) -> None:
    """Put a started Session where the checkpoint's run was: weights, optimizer, RNGs, data."""
    session.step_count = state["step_count"]
    session.version = state["version"]
    actor, engine = session.actor, session.engine
    actor.load_state_dict(state["actor"])
    if actor.ref_model is not None and state.get("ref_model") is not None:
        actor.load_ref_weights(state["ref_model"])  # (sharded: rank 0's shards; the others' come in "start")
    actor.version = session.version
    # (no gather: rank 0 alone; LoRA runs in one process, and its engine serves base + ΔW merged)
    weights = merged_weights(actor.model) if actor.lora else state["actor"]["model"]
    engine.update_weights(weights, version=session.version)
    engine.set_version(session.version)
    random.setstate(state["rng"]["python"])
    torch.set_rng_state(state["rng"]["torch"])
    if state.get("engine_rng") is not None:
        engine.set_rng_state(state["engine_rng"])
    session.data = session.data.at(state["data_pos"])
    session._history = list(state.get("history", []))

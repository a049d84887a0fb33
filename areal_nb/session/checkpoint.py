"""Session checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint folder holds `model/` (weights + tokenizer, loadable by transformers),
`config.yaml` (the run's config, with `model.path` pointing at `model/`), `state.pt` (optimizer,
step, version, RNG states, data position), `history.json` (the stats rows so far), `data/`
when the dataset was given as a Python object (its rows as JSONL; see `_store_python_datasets`),
and `manifest.json`: every other file's size and SHA-256, written last.

**A LoRA run's checkpoint holds the adapter, not a copy of the base.** `model/` then has the
base's config.json and the tokenizer but no weights; state.pt holds the adapter's tensors and
their optimizer state; `base_model.json` names the base (`base_model.py`) and config.yaml's
`model.path` is that base. A load whose base has other weights is refused (`check_same_base`).

**Saving never loses the checkpoint it replaces.** Everything is written into a temporary
sibling folder (`.NAME.saving-*`), fsynced, and only a complete folder takes the target's name
(the old one is renamed aside first and deleted after; if the second rename fails it is put
back). A failure at any write (a full disk, a killed process) leaves the earlier checkpoint as it
was and removes the partial one. A target that exists but is not a checkpoint (a file, or a
folder holding files a checkpoint does not write) is refused, never emptied.

**Loading checks before it starts anything**: `verify_checkpoint` (`checkpoint_verify.py`) checks
the folder as a whole, and refuses one without a manifest until `adopt_checkpoint` gave it one;
`restore` then puts the actor and engine where the saved run was. The files' names, the manifest
and the durable write are `checkpoint_files.py`'s.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from areal_nb.config import ConfigError, SessionConfig, dump_config
from areal_nb.data import load_rows, write_jsonl
from areal_nb.errors import CheckpointError
from areal_nb.train.lora import lora_base

from .base_model import write_base_file
from .checkpoint_files import MANIFEST, weight_files

# A save's last steps, under the names SAVE_STEPS gives them (a fault test fails each one here)
from .checkpoint_files import replace_folder as _replace
from .checkpoint_files import sync_tree as _sync_tree
from .checkpoint_files import write_manifest as _write_manifest
from .checkpoint_verify import adopt_checkpoint, verify_checkpoint
from .run_state import RunState

if TYPE_CHECKING:
    from areal_nb.api import InferenceEngine
    from areal_nb.train import Actor

    from .session import Session

# (also the names of checkpoint_files / checkpoint_verify that callers import from here)
__all__ = [
    "MANIFEST",
    "SAVE_STEPS",
    "CheckpointError",
    "adopt_checkpoint",
    "read_checkpoint",
    "restore",
    "save_checkpoint",
    "verify_checkpoint",
]


# The steps of a save, in order, each a function of this module (the fault tests fail each one)
SAVE_STEPS = (
    "_write_data",
    "_write_model",
    "_write_tokenizer",
    "_write_config",
    "_write_state",
    "_write_history",
    "_write_manifest",
    "_sync_tree",
    "_replace",
)


# ----------------------------------------------------------------------------- saving


def save_checkpoint(
    session: Session,
    path: str | Path,
    actor_state: dict[str, Any] | None = None,
    ref_weights: dict[str, Any] | None = None,
    *,
    run: RunState,
    model_path: str | Path | None = None,
    config: SessionConfig | None = None,
) -> Path:
    """Write the checkpoint folder (rank 0), replacing an earlier checkpoint at `path` only once
    the new one is complete. `run`: the run's progress (version, steps, data position, RNG
    states, history; the Session's `run_state()`). `actor_state` / `ref_weights`: the actor's full state and its KL
    reference's full weights when the caller already gathered them (under FSDP every rank takes
    part in those gathers; see `Session.save`). `model_path`: what config.yaml's `model.path`
    says (default: `path/model` resolved; an export names where its folder will be). `config`:
    the config to record (default: the Session's)."""
    final = Path(path).expanduser().absolute()
    cfg = copy.deepcopy(session.config if config is None else config)
    if not isinstance(cfg.agent.workflow, str):
        raise ConfigError("save() needs agent.workflow as an import string so the run can be restored")
    _check_target(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # (a user's path: permissions, a read-only filesystem, ...)
        raise CheckpointError(
            f"cannot save a checkpoint at {final}: {e.strerror or e} ({final.parent})"
        ) from e
    actor_state = session.actor.state_dict() if actor_state is None else actor_state
    ref_weights = session.actor.ref_weights() if ref_weights is None else ref_weights
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.saving-", dir=final.parent))
    try:
        # each step below is one module-level function, so a test can make any one of them fail
        _write_data(cfg, tmp, final)
        _write_model(session, actor_state, tmp)
        _write_tokenizer(session, tmp)
        if session.actor.lora:  # the base the adapter needs: named, not copied
            cfg.model.path = _lora_base(session)["path"]
        else:
            cfg.model.path = str(model_path) if model_path is not None else str(final.resolve() / "model")
        _write_config(cfg, tmp)
        _write_state(run, actor_state, ref_weights, tmp)
        _write_history(run, tmp)
        _write_manifest(tmp)
        _sync_tree(tmp)
        _replace(final, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _check_target(final: Path) -> None:
    """Save over nothing, an empty folder or an earlier checkpoint; refuse anything else."""
    for parent in final.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CheckpointError(f"cannot save a checkpoint at {final}: {parent} is not a folder")
            break
    if not final.exists() and not final.is_symlink():
        return
    if not final.is_dir():
        raise CheckpointError(f"cannot save a checkpoint at {final}: it exists and is not a folder")
    entries = sorted(p.name for p in final.iterdir())
    if entries and not ((final / MANIFEST).is_file() or (final / "state.pt").is_file()):
        raise CheckpointError(
            f"cannot save a checkpoint at {final}: the folder holds files that are not a "
            f"checkpoint's ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}); "
            f"choose another path or empty it"
        )


def _write_data(cfg: SessionConfig, tmp: Path, final: Path) -> None:
    _store_python_datasets(cfg.data, tmp / "data", final / "data")


def _write_model(session: Session, actor_state: dict[str, Any], tmp: Path) -> None:
    folder = tmp / "model"
    actor = session.actor
    model: Any = actor.model  # (a transformers or peft model: its methods are not nn.Module's)
    if actor.lora:  # the base's config (for the checks) and a reference to its weights; no weights
        cast(Any, lora_base(model)).config.save_pretrained(folder)
        write_base_file(_lora_base(session), tmp)
        return
    # (a copy: save_pretrained drops tied weights' duplicate keys from the dict it is given)
    model.save_pretrained(folder, state_dict=dict(actor_state["model"]))
    if not weight_files(folder):  # save_pretrained logs, rather than raises, some failures
        raise CheckpointError(f"saving the model wrote no weights into {folder}")


def _lora_base(session: Session) -> dict[str, Any]:
    """The base a LoRA run's adapter goes on (set by `start()` whenever `actor.lora` is)."""
    base = session.lora_base
    if base is None:
        raise CheckpointError("this LoRA run has no reference to its base model; it was not started")
    return base


def _write_tokenizer(session: Session, tmp: Path) -> None:
    session.tokenizer.save_pretrained(tmp / "model")


def _write_config(cfg: SessionConfig, tmp: Path) -> None:
    dump_config(cfg, tmp / "config.yaml")


def _write_state(
    run: RunState, actor_state: dict[str, Any], ref_weights: dict[str, Any] | None, tmp: Path
) -> None:
    state = {
        **run.saved(),
        "actor": actor_state,
        # the KL reference is the run's *initial* policy, not the saved weights it restarts from
        "ref_model": ref_weights,  # full tensors (None without kl_ctl)
    }
    torch.save(state, tmp / "state.pt")


def _write_history(run: RunState, tmp: Path) -> None:
    (tmp / "history.json").write_text(json.dumps(run.history, default=float))


def _store_python_datasets(data_cfg: Any, folder: Path, final: Path) -> None:
    """A dataset given as a Python object (list of dicts, DataFrame, datasets.Dataset) cannot go
    into config.yaml: its rows are written to `data/train.jsonl` / `data/eval.jsonl` in the
    checkpoint and the saved config points there (at `final`, where the folder will be; read back
    as rows, unchanged), so the checkpoint restores on its own. A path source stays a path (the
    file is not copied)."""
    for field, name in (("source", "train"), ("eval_source", "eval")):
        value = getattr(data_cfg, field)
        if value is None or isinstance(value, (str, Path)):
            continue
        rows = load_rows(value, name=f"data.{field}")
        write_jsonl(rows, folder / f"{name}.jsonl", name=f"data.{field}")
        setattr(data_cfg, field, str(final.resolve() / f"{name}.jsonl"))
        data_cfg.format = "rows"


# ----------------------------------------------------------------------------- loading


def read_checkpoint(path: str | Path, *, check_config: bool = True) -> dict[str, Any]:
    """The saved state (with its history), after `verify_checkpoint`; the config is loaded
    separately from config.yaml. Raises `CheckpointError` naming the file for any damage."""
    return verify_checkpoint(path, check_config=check_config)


def restore(actor: Actor, engine: InferenceEngine, state: dict[str, Any]) -> RunState:
    """Put rank 0's actor and engine where the checkpoint's run was (weights, optimizer, version,
    steps, RNGs) and return the run's state; the Session takes its data position and history
    from it."""
    run = RunState.from_saved(state)
    actor.load_state_dict(state["actor"])
    if actor.ref_model is not None and state.get("ref_model") is not None:
        actor.load_ref_weights(state["ref_model"])  # (sharded: rank 0's shards; the others' come in "start")
    # the actor owns the run's counters (an earlier checkpoint's actor state may lack steps_done)
    actor.version, actor.steps_done = run.version, run.steps
    # (no gather: rank 0 alone. A LoRA engine serves base + ΔW merged; sharded, the base is in
    # shards over the ranks, so the merged weights are pushed once all ranks joined: `Ranks.join`)
    if actor.lora and not actor.sharded:  # merged, or the adapter to servers that apply it
        actor.push_weights(engine)
    elif not actor.lora:
        engine.update_weights(state["actor"]["model"], version=run.version)
    engine.set_version(run.version)
    run.restore_rngs()
    if run.engine_rng is not None:
        engine.set_rng_state(run.engine_rng)
    return run

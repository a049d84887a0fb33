"""How `Session(...)` / `Session.load(...)` arguments become config overrides, and the config
as the plain data the metrics backends record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal_nb.config import SessionConfig, to_dict

from .base_model import BASE_FILE


def flatten_overrides(overrides: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`rollout={"batch_size": 4}` or `rollout__batch_size=4` → {"rollout.batch_size": 4}.

    Values stay Python objects, so an agent instance or class can be passed as
    `agent__workflow=MyAgent()`. A dict value for `workflow_kwargs` is kept whole.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        path = prefix + key.replace("__", ".")
        if isinstance(value, dict) and value and not path.endswith("workflow_kwargs"):
            out.update(flatten_overrides(value, path + "."))
        else:
            out[path] = value
    return out


def with_datasets(overrides: dict[str, Any], dataset: Any, eval_dataset: Any) -> dict[str, Any]:
    """The flat overrides with `dataset` / `eval_dataset` as `data.source` / `data.eval_source`."""
    flat = flatten_overrides(overrides)
    for key, value in (("data.source", dataset), ("data.eval_source", eval_dataset)):
        if value is not None:
            # a one-shot iterator is read once here; the Session (and save()) need its rows again
            flat[key] = value if hasattr(value, "__len__") or isinstance(value, Path) else list(value)
    return flat


def load_overrides(path: str | Path, config: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """`Session.load(path, **overrides)`'s overrides: without a `config` of its own, a full-weights
    checkpoint's model is the `model/` folder beside its config.yaml. The saved config.yaml names
    it by the absolute path it was written at, which is gone once the checkpoint is moved or
    copied (an exported run's folder, a job's result brought back from the cluster). A LoRA
    checkpoint's config.yaml names the base itself."""
    folder = Path(path)
    if (
        config is None
        and (folder / "model").is_dir()
        and not (folder / BASE_FILE).exists()
        and "model.path" not in flatten_overrides(overrides)
    ):
        return {**overrides, "model__path": str((folder / "model").resolve())}
    return overrides


def plain_config(cfg: SessionConfig) -> dict[str, Any]:
    """The config as JSON-able data (an agent object given in Python is named by its repr, a
    dataset given in Python by its type and length, not its rows)."""
    data = to_dict(cfg)
    for key in ("source", "eval_source"):
        value = data["data"][key]
        if value is not None and not isinstance(value, str):
            size = len(value) if hasattr(value, "__len__") else "?"
            data["data"][key] = f"<{type(value).__name__} of {size} rows>"
    return json.loads(json.dumps(data, default=repr))

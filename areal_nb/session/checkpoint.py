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

**Loading checks before it starts anything** (`verify_checkpoint`): the manifest's files are all
there with their sizes and hashes; config.yaml, history.json, the model's config and tokenizer
parse; the weights' tensors have the shapes the model's config.json gives them; state.pt holds
the weights and an optimizer state shaped like the model's trainable parameters. Any problem is
one `CheckpointError` naming the file and what is wrong with it.

**A checkpoint without a manifest** (written before checkpoints carried one) is refused, with a
message that says how to adopt it: `adopt_checkpoint(path)` runs the structural checks and
writes the manifest. Loading it with a warning would be friendlier, but the structural checks
cannot see every damage: half of a config.yaml is still a valid config (the missing keys take
their defaults), and a changed byte in the weights is still weights; a run would then continue
silently from something else than what was saved. Adopting is one deliberate call.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import yaml

from areal_nb.config import ConfigError, SessionConfig, dump_config, load_config
from areal_nb.data import load_rows, write_jsonl
from areal_nb.errors import CheckpointError
from areal_nb.train.lora import adapter_state, lora_base

from .base_model import BASE_FILE, read_base_file, read_json_file, write_base_file
from .run_state import RunState

if TYPE_CHECKING:
    from areal_nb.api import InferenceEngine
    from areal_nb.train import Actor

    from .session import Session

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "areal_nb checkpoint"
# What every checkpoint holds (besides model/'s weights and tokenizer files, checked by kind)
REQUIRED = ("config.yaml", "state.pt", "history.json", "model/config.json")
STATE_KEYS = ("step_count", "version", "actor", "rng", "data_pos")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")
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
    if not _weight_files(folder):  # save_pretrained logs, rather than raises, some failures
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


def _write_manifest(tmp: Path) -> None:
    files = {
        rel: {"size": (tmp / rel).stat().st_size, "sha256": _sha256(tmp / rel)}
        for rel in _files_under(tmp)
        if rel != MANIFEST
    }
    (tmp / MANIFEST).write_text(
        json.dumps({"format": MANIFEST_FORMAT, "version": 1, "files": files}, indent=1)
    )


def _sync_tree(folder: Path) -> None:
    """Every file and folder of the new checkpoint on disk before it takes the target's name."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_dir(Path(root))


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot sync a directory; the files are synced
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _replace(final: Path, new: Path) -> None:
    """`new` takes `final`'s name; an earlier `final` is renamed aside first, put back if that
    fails, and deleted once the new one is in place."""
    if not final.exists():
        os.replace(new, final)
        _sync_dir(final.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    os.replace(final, old)  # (onto the empty folder mkdtemp made)
    try:
        os.replace(new, final)
    except BaseException:
        os.replace(old, final)
        raise
    _sync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())


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


def verify_checkpoint(path: str | Path, *, check_config: bool = True) -> dict[str, Any]:
    """Check the checkpoint at `path` as a whole, without starting anything, and return its
    state (state.pt's contents plus `history`). `check_config=False` skips config.yaml (a caller
    that loads with a config of its own)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder} is not a Session checkpoint: "
            f"{'no such folder' if not folder.exists() else 'not a folder'}"
        )
    manifest = _read_manifest(folder)
    if manifest is None:
        raise CheckpointError(
            f"{folder / MANIFEST}: missing: this checkpoint has no list of its files' sizes and hashes (written by "
            f"an earlier areal_nb, or not a checkpoint), so damage to it cannot be detected. If you trust it, adopt "
            f"it once: from areal_nb.session.checkpoint import adopt_checkpoint; adopt_checkpoint({str(folder)!r})"
        )
    return _verify(folder, manifest, check_config)


def _verify(folder: Path, manifest: dict[str, Any] | None, check_config: bool) -> dict[str, Any]:
    skip = set() if check_config else {"config.yaml"}
    for rel in REQUIRED:
        if rel not in skip and not (folder / rel).is_file():
            raise CheckpointError(f"{folder / rel}: missing (every checkpoint holds {', '.join(REQUIRED)})")
    if manifest is not None:
        _check_manifest_files(folder, manifest, skip)
    if check_config:
        _check_config(folder)
    history = _check_history(folder / "history.json")
    model_config = _check_model_folder(folder / "model")
    expected = _expected_shapes(folder / "model", model_config)
    base = read_base_file(folder)  # LoRA: the base is named, its weights are not here
    if base is None:
        _check_weight_files(folder / "model", expected, model_config)
    state = _check_state(folder / "state.pt", expected, lora=base is not None)
    state["history"] = history
    state["base_model"] = base
    state["folder"] = str(folder)
    return state


def adopt_checkpoint(path: str | Path) -> Path:
    """Give a checkpoint written without a manifest one, after the structural checks (every file
    there, parsable and shaped like the model): from then on it loads, and any later damage to it
    is detected. What the checks cannot see (a changed byte) is adopted as it is."""
    folder = Path(path).expanduser()
    if (folder / MANIFEST).exists():
        raise CheckpointError(f"{folder / MANIFEST}: already there; nothing to adopt")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a Session checkpoint: not a folder")
    _verify(folder, manifest=None, check_config=True)
    _write_manifest(folder)
    _sync_tree(folder)
    return folder


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    file = folder / MANIFEST
    if not file.exists():
        return None
    manifest = read_json_file(file)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{file}: not an areal_nb checkpoint manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise CheckpointError(f"{file}: its file list is damaged (each entry needs a size and a sha256)")
    return manifest


def _check_manifest_files(folder: Path, manifest: dict[str, Any], skip: set[str]) -> None:
    files = manifest["files"]
    for rel in REQUIRED:
        if rel not in skip and rel not in files:
            raise CheckpointError(f"{folder / MANIFEST}: does not list {rel}")
    for rel, entry in files.items():
        if rel in skip:
            continue
        file = folder / rel
        if not file.resolve().is_relative_to(folder.resolve()):
            raise CheckpointError(f"{folder / MANIFEST}: lists {rel!r}, outside the checkpoint")
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST})")
        size = file.stat().st_size
        if size != entry["size"]:
            what = "truncated" if size < entry["size"] else "longer than saved"
            raise CheckpointError(f"{file}: {what}: {size} bytes, {MANIFEST} says {entry['size']}")
        if _sha256(file) != entry["sha256"]:
            raise CheckpointError(
                f"{file}: its contents changed since it was saved (SHA-256 differs from "
                f"{MANIFEST}): corrupted, or edited by hand"
            )


def _check_config(folder: Path) -> None:
    file = folder / "config.yaml"
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{file}: not readable YAML ({_one_line(e)})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: not a config (the top level must be a mapping)")
    try:
        load_config(data, {"model.path": str(folder / "model")})
    except ConfigError as e:
        raise CheckpointError(f"{file}: {e}") from e


def _check_history(file: Path) -> list[Any]:
    history = read_json_file(file)
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise CheckpointError(f"{file}: not a list of stats rows")
    return history


def _check_model_folder(folder: Path) -> Any:
    """The model's config (from config.json) after checking that the tokenizer loads whole."""
    from transformers import AutoConfig

    try:
        model_config = AutoConfig.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a bad file
        raise CheckpointError(f"{folder / 'config.json'}: not a model config ({_one_line(e)})") from e
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder}: no tokenizer vocabulary (none of {', '.join(TOKENIZER_FILES)})")
    from areal_nb.api.saved_tokenizer import load_saved_tokenizer

    try:
        tokenizer = load_saved_tokenizer(folder)
        ids = tokenizer.encode("1 + 2 = 3")
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{folder}: its tokenizer does not load ({_one_line(e)})") from e
    vocab = getattr(model_config, "vocab_size", None)
    if not ids or (vocab is not None and any(i >= vocab for i in ids)):
        raise CheckpointError(
            f"{folder}: its tokenizer ({len(tokenizer)} tokens) does not fit the model "
            f"(vocab_size {vocab}): it encodes text as {ids[:8]}"
        )
    return model_config


def _expected_shapes(folder: Path, model_config: Any) -> dict[str, tuple[int, ...]]:
    """Every tensor the model's config.json implies, by name and shape (built on the meta device:
    no memory, no weights read)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(
            f"{folder / 'config.json'}: no model can be built from it ({_one_line(e)})"
        ) from e
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _check_tensors(
    file: Path,
    what: str,
    shapes: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    *,
    tied_ok: bool,
) -> None:
    for name, shape in shapes.items():
        if name not in expected:
            raise CheckpointError(
                f"{file}: {what} {name!r} is not a tensor of the model in model/config.json"
            )
        if tuple(shape) != expected[name]:
            raise CheckpointError(
                f"{file}: {what} {name!r} has shape {list(shape)}, model/config.json gives "
                f"{list(expected[name])}"
            )
    missing = [n for n in expected if n not in shapes and not (tied_ok and n.endswith("lm_head.weight"))]
    if missing:
        raise CheckpointError(f"{file}: {len(missing)} {what}(s) of the model missing, e.g. {missing[0]!r}")


def _check_weight_files(folder: Path, expected: dict[str, tuple[int, ...]], model_config: Any) -> None:
    files = _weight_files(folder)
    if not files:
        raise CheckpointError(f"{folder}: no weights (no *.safetensors or *.bin file)")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        if file.suffix != ".safetensors":
            raise CheckpointError(f"{file}: areal_nb checkpoints hold safetensors weights only")
        from safetensors import safe_open

        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except Exception as e:  # noqa: BLE001 - SafetensorError for a bad header or short file
            raise CheckpointError(f"{file}: not readable safetensors ({_one_line(e)})") from e
    tied = bool(getattr(model_config, "tie_word_embeddings", False))
    _check_tensors(files[0] if len(files) == 1 else folder, "weight", shapes, expected, tied_ok=tied)


def _check_state(file: Path, expected: dict[str, tuple[int, ...]], *, lora: bool) -> dict[str, Any]:
    try:
        state = torch.load(file, weights_only=False, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - a truncated zip, a bad pickle, ...
        raise CheckpointError(f"{file}: not readable ({_one_line(e)})") from e
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        have = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{file}: not a Session state (needs {', '.join(STATE_KEYS)}; has {have})")
    actor = state["actor"]
    if (
        not isinstance(actor, dict)
        or not isinstance(actor.get("model"), dict)
        or not isinstance(actor.get("optimizer"), dict)
    ):
        raise CheckpointError(f"{file}: its actor state has no model weights or optimizer state")
    weights, trainable = _lora_split(actor["model"])
    if lora and (weights or not trainable):
        raise CheckpointError(
            f"{file}: a LoRA checkpoint ({BASE_FILE}) holds the adapter's tensors only; its actor "
            f"state has {len(weights)} other weight(s) and {len(trainable)} adapter tensor(s)"
        )
    if weights or not trainable:  # (an earlier LoRA checkpoint kept the base here as well)
        _check_tensors(
            file, "weight", {k: tuple(v.shape) for k, v in weights.items()}, expected, tied_ok=True
        )
    if trainable is not weights:
        _check_adapters(file, trainable, expected)
    for key in ("step_count", "version", "data_pos"):
        if not isinstance(state[key], int) or isinstance(state[key], bool) or state[key] < 0:
            raise CheckpointError(f"{file}: {key} must be a non-negative integer, got {state[key]!r}")
    _check_optimizer(file, actor["optimizer"], trainable)
    ref = state.get("ref_model")
    if ref is not None:
        _check_tensors(
            file, "reference weight", {k: tuple(v.shape) for k, v in ref.items()}, expected, tied_ok=True
        )
    return state


def _lora_split(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the model's weights under the plain model's names, the trainable ones). A LoRA actor's
    state (`actor.lora`) names peft's wrapped modules, and only its adapters train."""
    adapters = adapter_state(weights)
    if not adapters:
        return weights, weights
    base = {
        k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
        for k, v in weights.items()
        if k not in adapters
    }
    return base, adapters


def _check_adapters(
    file: Path, adapters: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]
) -> None:
    """Each adapter sits on a linear layer of the model in model/config.json and fits its shape:
    lora_A is [r, in_features], lora_B [out_features, r]."""
    for name, tensor in adapters.items():
        owner, _, rest = name.removeprefix("base_model.model.").partition(".lora_")
        shape = expected.get(f"{owner}.weight")
        if shape is None:
            raise CheckpointError(
                f"{file}: adapter {name!r} is on {owner!r}, not a layer of the model in model/config.json"
            )
        side = rest.split(".")[0]  # A or B
        if len(shape) == 2 and tensor.dim() == 2 and side in ("A", "B"):
            fits = tensor.shape[1] == shape[1] if side == "A" else tensor.shape[0] == shape[0]
            if not fits:
                raise CheckpointError(
                    f"{file}: adapter {name!r} has shape {list(tensor.shape)}, which does not fit "
                    f"{owner!r} ({list(shape)} in model/config.json)"
                )


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b)))


def _check_optimizer(file: Path, optimizer: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """The optimizer state covers the model's parameters in order, its moments shaped like them."""
    groups, moments = optimizer.get("param_groups"), optimizer.get("state")
    if not isinstance(groups, list) or not isinstance(moments, dict):
        raise CheckpointError(f"{file}: the optimizer state has no param_groups/state")
    # the trainable parameters, in model.parameters() order: tied weights count once
    seen: set[int] = set()
    params = []
    embed = next((t for k, t in weights.items() if k.endswith("embed_tokens.weight")), None)
    for name, tensor in weights.items():
        if name.endswith("lm_head.weight") and embed is not None and _same_tensor(tensor, embed):
            continue  # a tied head: under FSDP the gathered state holds it as a copy of the embedding
        key = tensor.data_ptr() if tensor.numel() else id(tensor)
        if key not in seen:
            seen.add(key)
            params.append(tensor)
    indices = [i for group in groups for i in group.get("params", [])]
    if len(indices) != len(params):
        raise CheckpointError(
            f"{file}: the optimizer state is for {len(indices)} parameters, the model has {len(params)}"
        )
    for position, index in enumerate(indices):
        for name, value in (moments.get(index) or {}).items():
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and tuple(value.shape) != tuple(params[position].shape)
            ):
                raise CheckpointError(
                    f"{file}: optimizer {name} of parameter {index} has shape {list(value.shape)}, "
                    f"the parameter {list(params[position].shape)}"
                )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


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

"""Checking a checkpoint before a load starts anything, and adopting one written without a manifest.

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

from pathlib import Path
from typing import Any

import torch
import yaml

from areal_nb.config import ConfigError, load_config
from areal_nb.errors import CheckpointError
from areal_nb.train.lora import adapter_state

from .base_model import BASE_FILE, read_base_file, read_json_file
from .checkpoint_files import (
    MANIFEST,
    REQUIRED,
    STATE_KEYS,
    TOKENIZER_FILES,
    read_manifest,
    sha256_of,
    sync_tree,
    weight_files,
    write_manifest,
)


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
    manifest = read_manifest(folder)
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
    write_manifest(folder)
    sync_tree(folder)
    return folder


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
        if sha256_of(file) != entry["sha256"]:
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
    files = weight_files(folder)
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

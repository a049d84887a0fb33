"""LoRA adapters on `areal-nb engine-server`, served the way SGLang serves them.

`AdapterServing` keeps the adapters loaded under their names (`/load_lora_adapter`,
`/unload_lora_adapter`, `--lora-paths`) and puts the one a request names (`lora_path` on
`/generate`) into the engine's weights.

How base + adapter is served: a merged copy. The engine's weights of the adapted modules are
replaced by base + B·A·scaling when a batch of that adapter starts (`switch`), computed from a
copy of those modules' base weights kept here, so switching back and forth never accumulates
rounding. The engine's forward stays the plain model's (its fast paths, its prefix cache, its
packed prefill), and its log-probs are those of exactly the merged tensors the trainer's
`merged_weights` computes in float32. The price: one adapter (or the base) is in the engine at a
time; a request for another waits until the running batch drains (first come, first served).
A training run uses one adapter at a time (each version's, loaded while generation is paused),
so it switches once per version. SGLang instead applies several adapters in one batch
(`--max-loras-per-batch`); that flag is accepted here and means nothing more than >= 1.

The adapter folder is peft's: `adapter_config.json` and `adapter_model.safetensors` (or
`adapter_model.bin`), tensors named `base_model.model.<module>.lora_A.weight` / `lora_B.weight`.
Refused with SGLang's words where SGLang refuses (DoRA, a rank above `--max-lora-rank`, target
modules outside `--lora-target-modules`, a name already loaded), and with ours where this server
cannot serve what SGLang might (biases, modules_to_save, per-module rank patterns, embeddings).
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .lora_flags import LORA_TARGET_ALL, LoraError, LoraSettings, normalized_target_modules

__all__ = ["Adapter", "AdapterServing", "LoraError", "LoraSettings", "read_adapter"]

_PREFIX = "base_model.model."


@dataclass(eq=False)  # compared by identity: a name unloaded and loaded again is another adapter
class Adapter:
    name: str
    path: str
    rank: int
    targets: set[str]  # normalised
    # base weight name → (A, B, scaling), float32 on the engine's device
    factors: dict[str, tuple[torch.Tensor, torch.Tensor, float]]

    def delta(self, key: str) -> torch.Tensor:
        a, b, scaling = self.factors[key]
        return (b @ a) * scaling  # peft's get_delta_weight (fan_in_fan_out False), in float32


def read_adapter_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except FileNotFoundError:
        raise LoraError(f"no adapter_config.json in {str(folder)!r}: not a peft adapter folder") from None
    except (OSError, ValueError) as exc:
        raise LoraError(f"cannot read {str(folder / 'adapter_config.json')!r}: {exc}") from None
    if not isinstance(config, dict) or "r" not in config or "lora_alpha" not in config:
        raise LoraError(
            f"{str(folder / 'adapter_config.json')!r} has no r and lora_alpha: not a LoRA adapter"
        )
    if "target_modules" not in config:
        raise LoraError(f"{str(folder / 'adapter_config.json')!r} names no target_modules")
    return config


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    safetensors = folder / "adapter_model.safetensors"
    try:
        if safetensors.is_file():
            from safetensors.torch import load_file

            return load_file(str(safetensors))
        binary = folder / "adapter_model.bin"
        if binary.is_file():
            return torch.load(binary, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse a client's file is the file's fault
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise LoraError(
            f"cannot read the adapter weights in {str(folder)!r}: {type(exc).__name__}: {text}"
        ) from None
    raise LoraError(f"no adapter_model.safetensors or adapter_model.bin in {str(folder)!r}")


def read_adapter(
    name: str, folder: Path, base_shapes: dict[str, torch.Size], device: torch.device
) -> Adapter:
    """The adapter in a peft folder, checked against the base model's weight shapes."""
    config = read_adapter_config(folder)
    if config.get("use_dora"):
        raise LoraError(f"Failed to load {name} because LoRA serving currently doesn't support DoRA adapters")
    for key, why in (
        ("bias", "bias terms"),
        ("modules_to_save", "modules_to_save"),
        ("rank_pattern", "per-module ranks (rank_pattern)"),
        ("alpha_pattern", "per-module alphas (alpha_pattern)"),
        ("fan_in_fan_out", "fan_in_fan_out (Conv1D) layers"),
    ):
        value = config.get(key)
        if value not in (None, False, "none", {}, []):
            raise LoraError(f"adapter {name}: areal-nb engine-server does not serve adapters with {why}")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = _read_tensors(folder)
    pairs: dict[str, dict[str, torch.Tensor]] = collections.defaultdict(dict)
    for key, value in tensors.items():
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if key.startswith(_PREFIX) and key.endswith(suffix):
                pairs[key[len(_PREFIX) : -len(suffix)] + ".weight"][part] = value
                break
        else:
            raise LoraError(
                f"adapter {name}: tensor {key!r} is not a LoRA A or B matrix of a linear layer "
                f"({_PREFIX}<module>.lora_A.weight / .lora_B.weight)"
            )
    factors: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for weight, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise LoraError(f"adapter {name}: {weight[: -len('.weight')]} has lora_A or lora_B alone")
        if weight not in base_shapes:
            raise LoraError(f"adapter {name}: the base model has no {weight!r}")
        a, b = pair["lora_A"].float(), pair["lora_B"].float()
        out_features, in_features = base_shapes[weight]
        if a.ndim != 2 or b.ndim != 2 or a.shape != (b.shape[1], in_features) or b.shape[0] != out_features:
            raise LoraError(
                f"adapter {name}: {weight[: -len('.weight')]} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                f"which do not fit the base weight {tuple(base_shapes[weight])}"
            )
        factors[weight] = (a.to(device), b.to(device), scaling)
    if not factors:
        raise LoraError(f"adapter {name}: {str(folder)!r} holds no LoRA tensors")
    return Adapter(name, str(folder), rank, normalized_target_modules(config["target_modules"]), factors)


class AdapterServing:
    """The loaded adapters and which one the engine's weights hold (see the module docstring).

    Not thread-safe by itself: engine-server calls `load` and `switch` one at a time (under its
    update flag) and the rest on its event loop."""

    def __init__(self, engine: Any, settings: LoraSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.loaded: collections.OrderedDict[str, Adapter] = collections.OrderedDict()
        self.ever_loaded: dict[str, str] = {}  # name → path: SGLang reloads an unloaded name on use
        self.applied: Adapter | None = None  # the adapter in the engine's weights (None: the base)
        self._base: dict[str, torch.Tensor] = {}  # base weights of every module an adapter touched
        self.uses: collections.Counter[Adapter] = collections.Counter()  # requests holding each
        self.max_rank = settings.max_lora_rank
        self.targets = normalized_target_modules(settings.target_modules) if settings.target_modules else None
        for name, path in settings.lora_paths.items():  # --lora-paths: loaded at start
            self.load(name, path)
        # as SGLang: what the flags leave open is taken from the adapters loaded at start
        if self.max_rank is None:
            self.max_rank = max(a.rank for a in self.loaded.values())
        if self.targets is None:
            self.targets = set().union(*(a.targets for a in self.loaded.values()))

    # -------------------------------------------------------------- load, unload

    def load(self, name: str, path: str | Path) -> None:
        """Read and check the adapter; LoraError (with SGLang's message where it has one)."""
        if name in self.loaded:
            raise LoraError(f"Failed to load LoRA adapter {name} because it is already loaded")
        weights = self.engine.model.state_dict()
        shapes = {k: v.shape for k, v in weights.items() if v.ndim == 2}
        adapter = read_adapter(name, Path(path), shapes, next(iter(weights.values())).device)
        targets = self.targets if self.targets is not None else {LORA_TARGET_ALL}
        if adapter.rank > (self.max_rank or adapter.rank) or not (
            LORA_TARGET_ALL in targets or LORA_TARGET_ALL in adapter.targets or adapter.targets <= targets
        ):
            raise LoraError(
                f"LoRA adapter {name} with rank {adapter.rank} is incompatible with the current LoRA memory "
                "pool configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`."
            )
        for key in adapter.factors:
            # these modules hold the base now: an applied adapter's modules are all kept already
            if key not in self._base:
                self._base[key] = weights[key].detach().clone()
        self.loaded[name] = adapter
        self.ever_loaded[name] = adapter.path

    def unregister(self, name: str) -> Adapter:
        """New requests can no longer use `name` (SGLang's words if it is not loaded); the caller
        waits until `uses` of the returned adapter is 0 before answering, as SGLang does."""
        if name not in self.loaded:
            names = collections.OrderedDict.fromkeys(self.loaded).keys()
            raise LoraError(f"LoRA with name {name} does not exist. Loaded LoRAs: {names}")
        return self.loaded.pop(name)

    def loaded_adapters(self) -> dict[str, str]:
        return {name: adapter.path for name, adapter in self.loaded.items()}

    # -------------------------------------------------------------- serving

    def unknown(self, name: str) -> str:
        """SGLang's answer to a request naming an adapter it never loaded."""
        return (
            f"Got LoRA adapter that has never been loaded: {name}\n"
            f"All loaded adapters: {dict.fromkeys(self.ever_loaded).keys()}."
        )

    def switch(self, adapter: Adapter | None) -> None:
        """Put base + `adapter` (None: the base alone) into the engine's weights, keeping its
        version. Called with nothing in flight."""
        keys = set(self.applied.factors if self.applied else ()) | set(adapter.factors if adapter else ())
        if keys:
            self.engine.update_weights({k: self._merged(adapter, k) for k in keys}, version=None)
        self.applied = adapter

    def update_base(self, state: dict[str, torch.Tensor], apply: Any) -> None:
        """A full-weights update: `apply(weights)` gets `state` (the new base) with the applied
        adapter on top; once it succeeds, the kept base copies are `state`'s."""
        new_base = {
            k: state[k].detach().to(self._base[k].device, self._base[k].dtype).clone()
            for k in self._base.keys() & state.keys()
        }
        adapter = self.applied
        if adapter is not None:
            state = {
                k: (self._merged(adapter, k, new_base.get(k)) if k in adapter.factors else v)
                for k, v in state.items()
            }
        apply(state)
        self._base.update(new_base)

    def _merged(self, adapter: Adapter | None, key: str, base: torch.Tensor | None = None) -> torch.Tensor:
        base = self._base[key] if base is None else base
        if adapter is None or key not in adapter.factors:
            return base
        # as the trainer's merged_weights: base + ΔW summed in float32, then in the engine's dtype
        return (base.float() + adapter.delta(key)).to(base.dtype)

"""LoRA adapters on the policy (`actor.lora`), with `peft`.

`wrap_lora(model, cfg)` freezes the base weights and adds trainable low-rank adapters
(ΔW = B·A·alpha/r, B starting at zero: the wrapped model starts as the base). The actor's
optimizer then holds only the adapter's parameters and their AdamW state.

peft injects its LoRA layers into the base model in place: the base model (`lora_base`)
computes base + adapter itself, so the trainer's forwards (and their fast paths that walk
`model.model.layers`: packing, tree attention, the last layer at the heads) run on the
unwrapped base model unchanged. `disable_adapter()` on the wrapper turns the adapters off in
those same layers: the KL reference is the base model that way, with no second copy.

The embedded engine, where it serves the trainer's parameters themselves (same device and
dtype: `LocalEngine(share_weights=True)`), is given the adapter tensors themselves
(`in_place_adapters`): its forward adds scaling·B(A(x)) to each adapted layer's output, as the
trainer's does, and a push copies nothing. Otherwise it gets merged weights (`merged_weights`:
base + ΔW under the base model's names) at each push: its forward stays the plain model's, and
the pushed tensors are exactly those the trainer's base + adapter computes with. An engine that serves adapters itself
(`serves_lora_adapters`: SGLang servers, `areal-nb engine-server`) gets the adapter alone
(`lora_adapter`: peft's saved tensors and adapter_config.json), a few MB instead of the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from areal_nb.api import InPlaceAdapters, LoraAdapter, LowRankAdapter, agent_token
from areal_nb.errors import ConfigError, InvalidArgumentError

__all__ = [
    "LoraConfig",
    "adapter_name",
    "adapter_state",
    "adapts_linear_layers_only",
    "check_shardable",
    "in_place_adapters",
    "is_lora_model",
    "load_adapter_state",
    "lora_adapter",
    "lora_base",
    "merged_weights",
    "use_adapter",
    "wrap_agent_lora",
    "wrap_lora",
]


@dataclass
class LoraConfig:
    """`actor.lora`: low-rank adapters trained on the frozen base model."""

    r: int = 8
    """The adapters' rank."""
    alpha: float = 16.0
    """ΔW is scaled by alpha / r."""
    target_modules: list[str] | str = field(default="all-linear")
    """peft's names: module-name suffixes (["q_proj", "v_proj"]) or "all-linear" (every linear
    layer but the LM head). The LM head cannot be adapted: the log-prob pass reads its weight."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        targets = [self.target_modules] if isinstance(self.target_modules, str) else list(self.target_modules)
        if not targets:
            raise ConfigError(
                "lora.target_modules is empty: name module suffixes (e.g. [q_proj, v_proj]) or all-linear"
            )
        if "lm_head" in targets:
            raise ConfigError(
                "lora.target_modules cannot hold lm_head: the log-prob pass reads the LM head's weight"
            )


def _peft_config(cfg: LoraConfig) -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError("LoRA needs peft: pip install 'areal_nb[lora]'") from exc
    return peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # (peft annotates int; scaling = alpha / r takes any)
        # none: the actor trains in eval mode, so that π_θ is the policy the engine sampled from
        lora_dropout=0.0,
        target_modules=cfg.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """`model` with trainable LoRA adapters (a `peft.PeftModel`); only the adapters require grad."""
    import peft

    return peft.get_peft_model(model, _peft_config(cfg))


adapter_name = agent_token  # the peft adapter name of an agent's adapter


def wrap_agent_lora(model: torch.nn.Module, configs: dict[str, LoraConfig]) -> torch.nn.Module:
    """`model` with one LoRA adapter per agent (`adapter_name(agent)`), all on the one frozen base.
    Every adapter requires grad; `use_adapter` picks the one a forward runs."""
    import peft

    if not configs:
        raise InvalidArgumentError("wrap_agent_lora needs at least one agent")
    names = {agent: adapter_name(agent) for agent in configs}
    if len(set(names.values())) < len(names):
        raise InvalidArgumentError(
            f"agents {sorted(configs)}: each agent needs a name of its own once characters other than "
            "letters, digits, '_' and '-' are replaced by '_' (the adapter names)"
        )
    agents = list(configs)
    wrapped = peft.get_peft_model(model, _peft_config(configs[agents[0]]), adapter_name=names[agents[0]])
    for agent in agents[1:]:
        wrapped.add_adapter(names[agent], _peft_config(configs[agent]))
    _all_adapters_train(wrapped)
    return wrapped


def _all_adapters_train(model: torch.nn.Module) -> None:
    # peft marks only the active adapter trainable; an inactive adapter takes no part in the
    # forward, so it gets no gradient either way, and AdamW skips a parameter whose grad is None
    for name, param in model.named_parameters():
        if is_adapter_key(name):
            param.requires_grad_(True)


def use_adapter(model: Any, agent: str) -> None:
    """The next forwards (and `merged_weights`, `lora_adapter`) run `agent`'s adapter; every
    adapter stays trainable (peft's `set_adapter` freezes the others)."""
    model.set_adapter(adapter_name(agent))
    _all_adapters_train(model)


def is_lora_model(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def lora_base(model: torch.nn.Module) -> torch.nn.Module:
    """The model the forwards run: a PeftModel's base (adapters injected), else `model` itself."""
    return cast(Any, model).get_base_model() if is_lora_model(model) else model


def is_adapter_key(name: str) -> bool:
    """A peft state-dict key of an adapter tensor (`...q_proj.lora_A.default.weight`)."""
    return any(part.startswith("lora_") for part in name.split("."))


def adapter_state(state: dict[str, Any]) -> dict[str, Any]:
    """The adapter's tensors of a wrapped model's state dict (the frozen base left out): what a
    LoRA checkpoint keeps of the model."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}


def load_adapter_state(model: torch.nn.Module, adapters: dict[str, Tensor]) -> None:
    """Put `adapter_state`'s tensors back into the wrapped `model` (its base untouched). A state
    holding the base too (a full state dict) gives its adapters only. Raises ValueError when the
    adapters do not fit the model (another rank, other target modules)."""
    adapters = adapter_state(adapters)
    own = adapter_state(model.state_dict())
    missing, unexpected = sorted(own.keys() - adapters.keys()), sorted(adapters.keys() - own.keys())
    if missing or unexpected:
        raise InvalidArgumentError(
            "the saved LoRA adapter does not fit this model's actor.lora: "
            + (f"{len(missing)} adapter tensor(s) missing, e.g. {missing[0]!r}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"{len(unexpected)} not in the model, e.g. {unexpected[0]!r}" if unexpected else "")
        )
    for name, value in adapters.items():
        if tuple(value.shape) != tuple(own[name].shape):
            raise InvalidArgumentError(
                f"the saved LoRA adapter does not fit this model's actor.lora: {name!r} has shape "
                f"{list(value.shape)}, the model's {list(own[name].shape)} (another lora.r?)"
            )
    model.load_state_dict(adapters, strict=False)


@torch.no_grad()
def merged_weights(
    model: torch.nn.Module, adapters: bool = True, state: dict[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """The base model's state dict with each active adapter's ΔW added to its layer's weight,
    under the plain model's names (no adapter tensors; `model` itself is unchanged).
    `adapters=False`: the frozen base weights alone, under the same names. `state`: the base's
    state dict as full tensors when the caller gathered them (FSDP shards the model); ΔW is then
    computed from those tensors, as peft computes it for a linear layer."""
    from peft.tuners.lora import LoraLayer

    base = lora_base(model)
    state = base.state_dict() if state is None else state
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules() if adapters else ():
        if isinstance(module, LoraLayer) and not module.disable_adapters:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = _delta_weight(module, name, adapter, state)
                    deltas[name] = deltas[name] + delta if name in deltas else delta
    out: dict[str, Any] = {}
    for key, value in state.items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        if "base_layer" in parts:
            owner = ".".join(parts[: parts.index("base_layer")])
            if parts[-1] == "weight" and owner in deltas:
                value = value + deltas[owner].to(value.dtype)
            key = ".".join(p for p in parts if p != "base_layer")
        out[key] = value
    return out


def _delta_weight(module: Any, name: str, adapter: str, state: dict[str, Tensor]) -> Tensor:
    """ΔW = B·A·scaling of one adapter of a linear layer, from `state`'s tensors (peft's
    `Linear.get_delta_weight`, which reads the module's own, possibly sharded, weights)."""
    from peft.tuners.lora import Linear

    if not isinstance(module, Linear):
        return module.get_delta_weight(adapter)
    delta = state[f"{name}.lora_B.{adapter}.weight"] @ state[f"{name}.lora_A.{adapter}.weight"]
    return (delta.T if module.fan_in_fan_out else delta) * module.scaling[adapter]


def adapts_linear_layers_only(model: torch.nn.Module, cfg: LoraConfig) -> bool:
    """Whether `cfg` adapts only linear layers of `model` (not yet wrapped): what an engine serving
    the trainer's tensors can serve in place (`in_place_adapters`)."""
    if cfg.target_modules == "all-linear":  # (peft's expansion: the linear layers but the LM head)
        return True
    from peft.tuners.tuners_utils import check_target_module_exists

    config = _peft_config(cfg)
    return all(
        type(module) is torch.nn.Linear
        for name, module in model.named_modules()
        if name and check_target_module_exists(config, name)
    )


def in_place_adapters(model: torch.nn.Module) -> InPlaceAdapters:
    """The active adapter's tensors themselves (no copies) by adapted module, for an engine that
    serves the trainer's parameters in place (`api.InPlaceAdapters`): one policy, linear layers."""
    from peft.tuners.lora import Linear, LoraLayer

    modules: dict[str, LowRankAdapter] = {}
    for name, module in lora_base(model).named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, Linear) or type(module.get_base_layer()) is not torch.nn.Linear:
            raise InvalidArgumentError(
                f"an engine serves LoRA adapters in place on linear layers only; {name!r} is not one"
            )
        active = [a for a in module.active_adapters if a in module.lora_A]
        if len(active) != 1:
            raise InvalidArgumentError(f"{name!r} runs {len(active)} adapters: one is served in place")
        adapter = active[0]
        modules[name] = LowRankAdapter(
            a=module.lora_A[adapter].weight, b=module.lora_B[adapter].weight, scaling=module.scaling[adapter]
        )
    return InPlaceAdapters(modules)


def check_shardable(model: torch.nn.Module) -> None:
    """FSDP (`actor.parallel: fsdp`) merges ΔW from gathered tensors: linear layers' adapters only."""
    from peft.tuners.lora import Linear, LoraLayer

    other = [
        n
        for n, m in lora_base(model).named_modules()
        if isinstance(m, LoraLayer) and not isinstance(m, Linear)
    ]
    if other:
        raise InvalidArgumentError(
            f"actor.lora with actor.parallel=fsdp adapts linear layers only; {other[0]!r} is not one "
            f"(name linear layers in lora.target_modules, or use actor.parallel=ddp)"
        )


@torch.no_grad()
def lora_adapter(model: Any, state: dict[str, Tensor] | None = None) -> LoraAdapter:
    """The active adapter as peft's `save_pretrained` writes it: its tensors (detached copies, in
    the dtype they train in) under peft's saved names, and adapter_config.json's content.
    `state`: the adapter's full tensors when the caller gathered them (FSDP shards the model)."""
    from peft import get_peft_model_state_dict

    name = model.active_adapter
    saved = get_peft_model_state_dict(model, state_dict=state, adapter_name=name)
    tensors = {k: v.detach().clone() for k, v in saved.items()}
    config = model.peft_config[name].to_dict()
    config["inference_mode"] = True  # (as save_pretrained writes it)
    return LoraAdapter(tensors=tensors, config={k: _json_ready(v) for k, v in config.items()})


def _json_ready(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value

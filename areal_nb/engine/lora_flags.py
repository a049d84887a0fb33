"""SGLang's LoRA launch flags (`--enable-lora`, `--max-lora-rank`, `--lora-target-modules`,
`--max-loras-per-batch`, `--lora-paths`): their values and checks, as SGLang resolves them, for
`areal-nb engine-server` and the launcher (no torch here: the CLI parses flags before loading it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from areal_nb.errors import LoraError

# SGLang's `--lora-target-modules` choices (`sglang.srt.utils.common.SUPPORTED_LORA_TARGET_MODULES`
# and "all"), so a flag one refuses the other refuses too.
LORA_TARGET_ALL = "all"
SGLANG_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q_a_proj",
    "kv_a_proj_with_mqa",
    "q_b_proj",
    "kv_b_proj",
    "wq_b",
    "wk",
    "weights_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "embed_tokens",
    "lm_head",
    "qkvr",
    "wo_ud",
    LORA_TARGET_ALL,
)
# SGLang compares target modules after fusing them as its layers are fused (q/k/v → qkv_proj,
# gate/up → gate_up_proj): `--lora-target-modules q_proj` admits an adapter on k_proj.
_FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "q_a_proj": "fused_qkv_a_proj_with_mqa",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
}
DEFAULT_MAX_LORAS_PER_BATCH = 8  # SGLang's default


def normalized_target_modules(names: str | list[str] | set[str]) -> set[str]:
    """SGLang's normalisation of target-module names ({"all"} for the peft shorthands)."""
    if isinstance(names, str):
        if names not in (LORA_TARGET_ALL, "all-linear"):
            raise LoraError("Only 'all' or 'all-linear' can be used as the string for target module")
        return {LORA_TARGET_ALL}
    return {_FUSED.get(n.split(".")[-1], n.split(".")[-1]) for n in names}


@dataclass
class LoraSettings:
    """The server's `--enable-lora` family of flags (SGLang's names and checks)."""

    max_lora_rank: int | None = None
    target_modules: list[str] | None = None  # None: taken from the --lora-paths adapters
    max_loras_per_batch: int = DEFAULT_MAX_LORAS_PER_BATCH
    lora_paths: dict[str, str] = field(default_factory=dict)  # name → folder, loaded at start

    def __post_init__(self) -> None:
        if self.max_loras_per_batch <= 0:
            raise LoraError("max_loras_per_batch must be positive")
        if self.target_modules and LORA_TARGET_ALL in self.target_modules and len(self.target_modules) > 1:
            raise LoraError(
                "If 'all' is specified in --lora-target-modules, it should be the only module specified."
            )
        if not self.lora_paths and not (self.max_lora_rank and self.target_modules):
            raise LoraError(
                "When no initial --lora-paths is provided, you need to specify both --max-lora-rank "
                "and --lora-target-modules for LoRA initialization."
            )


def parse_lora_paths(items: list[str]) -> dict[str, str]:
    """`--lora-paths` items as SGLang reads them: `PATH`, `NAME=PATH` or a JSON object with
    `lora_name` and `lora_path`."""
    out: dict[str, str] = {}
    for item in items:
        if item.lstrip().startswith("{"):
            entry = json.loads(item)
            if not isinstance(entry, dict) or "lora_name" not in entry or "lora_path" not in entry:
                raise LoraError(f"--lora-paths JSON needs lora_name and lora_path, got {item!r}")
            out[str(entry["lora_name"])] = str(entry["lora_path"])
        elif "=" in item:
            name, path = item.split("=", 1)
            out[name] = path
        else:
            out[item] = item
    return out

"""SGLang's native HTTP API (the subset an RL client uses), as types both sides share.

`docs/reference/sglang-api.md` states the contract: the closed `sampling_params` key set of sglang 0.5.23
(`sglang/api/v1/api_types.py::_FIELDS_SamplingParams`) and the control routes' bodies.
`areal-nb engine-server` validates requests with these models, so an unknown sampling key is a 400
as on SGLang. The `/generate` payload and answer themselves (built and parsed by both sides) are
in `sglang_wire.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from areal_nb.errors import InvalidArgumentError

# sglang 0.5.23 `_FIELDS_SamplingParams`, in its order.
SAMPLING_PARAM_KEYS: tuple[str, ...] = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)

PAUSE_MODES = ("abort", "retract", "in_place")


class _NullIsDefault(BaseModel):
    """`null` for a field means its default, as in SGLang (its schema declares these fields
    optional and `SamplingParams.__post_init__` puts the default back); any other wrong type is
    refused."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {
                k: v
                for k, v in data.items()
                if v is not None or k not in cls.model_fields or cls.model_fields[k].default is None
            }
        return data


class SamplingParams(_NullIsDefault):
    """The closed key set; types as strict as sglang's generated schema (an int field takes no 1.0,
    a number field no `true` or `"1"`)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt | None = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    stop_regex: str | list[str] | None = None
    temperature: StrictFloat = 1.0
    top_p: StrictFloat = 1.0
    top_k: StrictInt = -1
    min_p: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    presence_penalty: StrictFloat = 0.0
    repetition_penalty: StrictFloat = 1.0
    min_new_tokens: StrictInt = 0
    n: StrictInt = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    stream_interval: StrictInt | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: StrictInt | None = None
    custom_params: dict[str, Any] | None = None
    beam_width: StrictInt | None = None
    watermark: Any = None
    choice: Any = None


class GenerateRequest(_NullIsDefault):
    """`POST /generate`. Unknown top-level keys are ignored, as in sglang."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    input_embeds: Any = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] = -1
    top_logprobs_num: StrictInt | list[StrictInt] = 0
    stream: StrictBool = False
    # the name of a loaded LoRA adapter (one for the batch, or one per prompt; null: the base)
    lora_path: StrictStr | list[StrictStr | None] | None = None


# The control routes' bodies. Types are strict, as SGLang's decoder is: a flag is a JSON boolean
# (`abort_all: "yes"` is a 400, not "abort everything"), a version or path a JSON string.


class AbortRequest(BaseModel):
    rid: StrictStr = ""
    abort_all: StrictBool = False


class PauseRequest(BaseModel):
    mode: StrictStr = "abort"

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in PAUSE_MODES:
            raise InvalidArgumentError(f"mode must be one of {list(PAUSE_MODES)}, got {mode!r}")
        return mode


class UpdateWeightsFromDiskRequest(BaseModel):
    model_path: StrictStr
    load_format: StrictStr | None = None
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    flush_cache: StrictBool = True
    keep_pause: StrictBool = False


class LoadLoraAdapterRequest(BaseModel):
    """`POST /load_lora_adapter` (sglang's `LoadLoRAAdapterReqInput`; `lora_id` is its own)."""

    lora_name: StrictStr
    lora_path: StrictStr
    pinned: StrictBool = False


class UnloadLoraAdapterRequest(BaseModel):
    """`POST /unload_lora_adapter` (sglang's `UnloadLoRAAdapterReqInput`)."""

    lora_name: StrictStr


def lora_update_reply(
    success: bool, error_message: str | None, loaded_adapters: dict[str, str] | None
) -> dict[str, Any]:
    """sglang's `LoRAUpdateOutput` as its HTTP route writes it (its request-routing fields are
    always null over HTTP)."""
    return {
        "rid": None,
        "http_worker_ipc": None,
        "success": success,
        "error_message": error_message,
        "loaded_adapters": loaded_adapters,
    }


class UpdateWeightVersionRequest(BaseModel):
    new_version: StrictStr
    abort_all_requests: StrictBool = True


def unknown_sampling_keys(params: dict[str, Any]) -> list[str]:
    return sorted(set(params) - set(SAMPLING_PARAM_KEYS))


def unknown_field_message(key: str) -> str:
    """sglang 0.5.22+'s wording for an unknown sampling key (serde-style)."""
    return f"unknown field `{key}`, expected one of " + ", ".join(f"`{k}`" for k in SAMPLING_PARAM_KEYS)

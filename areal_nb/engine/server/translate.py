"""The engine-server's translation between SGLang's wire and the engine's types.

A `/generate` body becomes `Item`s (one `ModelRequest` per prompt, its sampling parameters
checked against what the engine can honour: anything else is a 400 naming the key), a
`ModelResponse` becomes SGLang's answer (`sglang_wire.generate_answer`), and the control routes'
arguments (a weight version, a weights folder under `--weights-dir`) are checked here. A wrong
JSON type is named in serde's words, as SGLang's decoder says it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson
from pydantic import ValidationError

from areal_nb.api import GenerationConfig, InvalidRequestError, ModelRequest, ModelResponse
from areal_nb.errors import BadRequest, ContractViolation

from ..native_api import GenerateRequest, SamplingParams, unknown_field_message, unknown_sampling_keys
from ..sglang_wire import GenerateAnswer, finish_abort, finish_length, finish_stop, generate_answer

# SGLang's sampling parameters this engine cannot honour (a 400 naming the first one set).
_UNSUPPORTED_IF_SET = tuple(
    "stop_regex json_schema regex ebnf structural_tag logit_bias sampling_seed custom_params beam_width "
    "watermark choice".split()
)


@dataclass
class Item:
    rid: str
    request: ModelRequest
    sampling: SamplingParams
    return_logprob: bool


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


_TYPE_ERRORS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "string_type": "a string",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}
# the names pydantic puts in an error's location for the branch of a union it tried
_UNION_BRANCHES = {"str", "int", "float", "bool", "dict", "list", "none"}


def validation_message(exc: ValidationError) -> str:
    """Each wrong field once, named, in serde's words where it is a wrong JSON type (as SGLang's
    decoder says it): `sampling_params.max_new_tokens: invalid type: floating point `4.0`, expected an integer`."""
    seen: dict[str, str] = {}
    for e in exc.errors():
        field = ".".join(
            str(p)
            for p in e["loc"]
            if isinstance(p, int) or ("[" not in p and "-" not in p and p not in _UNION_BRANCHES)
        )
        field = field or "body"
        if field in seen:
            continue
        if e["type"] in _TYPE_ERRORS:
            seen[field] = (
                f"{field}: invalid type: {_unexpected(e.get('input'))}, expected {_TYPE_ERRORS[e['type']]}"
            )
        elif e["type"] == "extra_forbidden":
            seen[field] = f"unknown field `{field.rsplit('.', 1)[-1]}`"
        else:
            seen[field] = f"{field}: {e['msg']}"
    return "; ".join(seen.values())


def _unexpected(value: Any) -> str:
    """A JSON value as serde's `Unexpected` shows it (shortened)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value[:40]}"' + ("..." if len(value) > 40 else "")
    return (
        "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else type(value).__name__
    )


def per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def plan_generate(body: GenerateRequest, engine: Any) -> list[Item]:
    if body.text is not None or body.input_embeds is not None:
        raise BadRequest("areal-nb engine-server takes input_ids only (apply the chat template client-side)")
    if body.input_ids is None:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if body.stream:
        raise BadRequest("areal-nb engine-server does not stream; send stream=false")
    batch = cast(
        list[list[int]],
        body.input_ids if body.input_ids and isinstance(body.input_ids[0], list) else [body.input_ids],
    )
    n = len(batch)
    if isinstance(body.rid, str) and n > 1:
        rids = [f"{body.rid}_{i}" for i in range(n)]
    elif body.rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    else:
        rids = per_item(body.rid, n, "rid")
    params = per_item(body.sampling_params or {}, n, "sampling_params")
    return_logprob = per_item(body.return_logprob, n, "return_logprob")
    if any(per_item(body.top_logprobs_num, n, "top_logprobs_num")):
        raise BadRequest(
            "areal-nb engine-server returns the sampled tokens' log-probs only (top_logprobs_num=0)"
        )
    for start in per_item(body.logprob_start_len, n, "logprob_start_len"):
        if start != -1:
            raise BadRequest("areal-nb engine-server returns output log-probs only (logprob_start_len=-1)")
    items = []
    for ids, rid, raw, want_logprob in zip(batch, rids, params, return_logprob, strict=True):
        if not ids:
            raise BadRequest("input_ids cannot be empty.")
        sampling = _sampling_params(raw)
        gconfig = _generation_config(sampling, len(ids), engine)
        items.append(
            Item(rid, ModelRequest(input_ids=list(ids), gconfig=gconfig, rid=rid), sampling, want_logprob)
        )
    return items


def _sampling_params(raw: Any) -> SamplingParams:
    if not isinstance(raw, dict):
        raise ContractViolation("sampling_params must be an object")
    unknown = unknown_sampling_keys(raw)
    if unknown:
        raise ContractViolation(unknown_field_message(unknown[0]))
    try:
        return SamplingParams.model_validate(raw)
    except ValidationError as exc:
        raise ContractViolation(validation_message(exc)) from None


def _generation_config(sp: SamplingParams, prompt_len: int, engine: Any) -> GenerationConfig:
    """sglang's sampling semantics → our GenerationConfig; what the engine cannot honour is a 400."""
    for key in _UNSUPPORTED_IF_SET:
        if getattr(sp, key) is not None:
            raise BadRequest(f"sampling_params.{key} is not supported by areal-nb engine-server")
    if sp.n != 1:
        raise BadRequest("sampling_params.n must be 1: send n separate requests")
    if sp.min_p or sp.presence_penalty or sp.repetition_penalty != 1.0:
        raise BadRequest(
            "min_p, presence_penalty and repetition_penalty are not supported by areal-nb engine-server"
        )
    max_new = 128 if sp.max_new_tokens is None else sp.max_new_tokens
    context = engine.max_context
    if context is not None and prompt_len + max_new > context:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} tokens: "
            f"{prompt_len} prompt tokens + max_new_tokens={max_new}"
        )
    greedy = 0 <= sp.temperature < 1e-6  # sglang: below 1e-6 is greedy
    stop = [sp.stop] if isinstance(sp.stop, str) else sp.stop
    config = GenerationConfig(
        max_new_tokens=max_new,
        min_new_tokens=sp.min_new_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        stop_token_ids=list(sp.stop_token_ids or []),
        stop=stop or None,
        ignore_eos=sp.ignore_eos,
        skip_special_tokens=sp.skip_special_tokens,
        frequency_penalty=sp.frequency_penalty,
    )
    try:  # the sampling ranges, checked once here at the door; the engine trusts a checked config
        return config.check()
    except InvalidRequestError as exc:
        raise BadRequest(str(exc)) from None


def reply(engine: Any, item: Item, out: ModelResponse) -> GenerateAnswer:
    sp, tokenizer = item.sampling, engine.tokenizer
    finish, text_end = _finish_reason(engine, item, out)
    text = ""
    if tokenizer is not None:
        text = tokenizer.decode(
            out.output_tokens[:text_end] if not sp.no_stop_trim else out.output_tokens,
            skip_special_tokens=sp.skip_special_tokens,
        )
        if finish.get("type") == "stop" and isinstance(finish.get("matched"), str) and not sp.no_stop_trim:
            text = text[: text.find(finish["matched"])] if finish["matched"] in text else text
    return generate_answer(
        rid=item.rid,
        text=text,
        prompt_tokens=len(out.input_tokens),
        output_ids=list(out.output_tokens),
        logprobs=list(out.output_logprobs) if item.return_logprob else None,
        finish=finish,
        versions=list(out.output_versions),
        version_now=engine.get_version(),
        latency=out.latency,
    )


def _finish_reason(engine: Any, item: Item, out: ModelResponse) -> tuple[dict[str, Any], int]:
    """sglang's finish_reason object, and where the text ends if the stop token is trimmed."""
    n = len(out.output_tokens)
    if out.stop_reason == "abort":
        return finish_abort(), n
    if out.stop_reason == "length":
        return finish_length(item.request.gconfig.max_new_tokens), n
    g = item.request.gconfig
    stop_ids = set(g.stop_token_ids) | (set() if g.ignore_eos else set(engine.eos_token_ids))
    if out.output_tokens and out.output_tokens[-1] in stop_ids:
        return finish_stop(out.output_tokens[-1]), n - 1
    text = engine.tokenizer.decode(out.output_tokens, skip_special_tokens=False) if engine.tokenizer else ""
    return finish_stop(next((s for s in (g.stop or []) if s in text), None)), n


def int_version(version: str) -> int:
    try:
        value = int(version)
    except (TypeError, ValueError):
        raise BadRequest(
            f"weight_version must be an integer string for areal-nb engine-server, got {version!r}"
        ) from None
    if value < 0:  # -1 marks prompt tokens in the exported versions; a policy version is >= 0
        raise BadRequest(f"weight_version must be >= 0, got {value}")
    return value


def allowed_weights_path(model_path: str, root: Path | None) -> Path:
    """The resolved directory, if it and every weight file in it lie under `root`. A path the file
    system cannot take (a NUL byte, a name too long, a symlink loop, no permission) is the
    client's error, named."""
    if root is None:
        raise BadRequest("this server was started without --weights-dir: it loads no weights from disk")
    shown = model_path if len(model_path) <= 200 else f"{model_path[:200]}... ({len(model_path)} characters)"
    try:
        path = Path(model_path)
        if not path.is_absolute():
            path = root / path
        resolved = path.resolve()
        if not resolved.is_relative_to(root):
            raise BadRequest(f"model_path {shown!r} is outside the allowed weights directory {str(root)!r}")
        if not resolved.is_dir():
            raise BadRequest(f"model_path {shown!r} is not a directory under {str(root)!r}")
        for entry in resolved.iterdir():
            if not entry.resolve().is_relative_to(root):  # a symlinked weight file pointing elsewhere
                raise BadRequest(f"{entry.name!r} in {shown!r} links outside the allowed weights directory")
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Path.resolve)
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(
            f"model_path {shown!r} cannot be used: {type(exc).__name__}: {_short(exc)}"
        ) from None
    return resolved


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."

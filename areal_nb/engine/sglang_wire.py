"""SGLang's `/generate` wire, written once: the payload `SGLangEngine` sends, the answer
`areal-nb engine-server` writes, and the parsing of that answer back into tokens, log-probs,
per-token versions and a stop reason.

Both sides import this module, so the client and the server cannot drift apart on a key; the
contract is `docs/reference/sglang-api.md` ("Generate"), and `tests/engine/test_sglang_source.py`
checks the payloads against SGLang's own request types. The request bodies the server validates
(all routes) are pydantic models in `native_api.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from areal_nb.api import GenerationConfig
from areal_nb.errors import EngineServerError

# finish_reason.type → our STOP_REASONS (areal_nb.api.io_struct). Every SGLang FINISH_* class has
# one of these three types; anything else is a protocol error, never silently "stop".
FINISH_TYPE_TO_STOP_REASON: dict[str, str] = {"stop": "stop", "length": "length", "abort": "abort"}


class GeneratePayload(TypedDict):
    """The body of `POST /generate` as `SGLangEngine` sends it (one prompt)."""

    input_ids: list[int]
    rid: str
    sampling_params: dict[str, Any]
    return_logprob: bool
    stream: bool
    lora_path: NotRequired[str]


class VersionSpan(TypedDict):
    version: str
    start: int
    end: int


class GenerateAnswer(TypedDict):
    """One prompt's `/generate` answer: `meta_info` holds `id`, `finish_reason`, token counts,
    `weight_version`, `weight_versions` spans, `e2e_latency` and, with `return_logprob`, the
    `output_token_logprobs` triples `[logprob, token, null]`."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


@dataclass(frozen=True)
class GenerateResult:
    """What the client reads from one answer."""

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]  # one per token
    stop_reason: str  # "stop" | "length" | "abort"


# ---------------------------------------------------------------------- the client's payload


def generate_payload(
    input_ids: list[int],
    max_new: int,
    g: GenerationConfig,
    produced: int,
    rid: str,
    lora_path: str | None = None,
) -> GeneratePayload:
    """The /generate body: only keys of the closed sampling_params set; `produced` tokens of this
    request were generated already (a re-send after a pause: the minimum shrinks by as many);
    `lora_path` names the loaded LoRA adapter to generate with (None: the base model)."""
    params: dict[str, Any] = {
        "max_new_tokens": int(max_new),
        "min_new_tokens": max(0, int(g.min_new_tokens) - produced),
        "temperature": 0.0 if g.greedy else float(g.temperature),
        "top_p": float(g.top_p),
        "top_k": -1 if g.top_k >= 1 << 20 else int(g.top_k),  # our "no limit" default is 1e8
        "stop_token_ids": [int(t) for t in g.stop_token_ids],
        "ignore_eos": bool(g.ignore_eos),
        "skip_special_tokens": bool(g.skip_special_tokens),
        "no_stop_trim": True,
    }
    if g.stop:
        params["stop"] = list(g.stop)
    if g.frequency_penalty:
        params["frequency_penalty"] = float(g.frequency_penalty)
    payload: GeneratePayload = {
        "input_ids": input_ids,
        "rid": rid,
        "sampling_params": params,
        "return_logprob": True,
        "stream": False,
    }
    if lora_path is not None:
        payload["lora_path"] = lora_path
    return payload


# ---------------------------------------------------------------------- the server's answer


def finish_abort() -> dict[str, Any]:
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def finish_length(max_new_tokens: int) -> dict[str, Any]:
    return {"type": "length", "length": max_new_tokens}


def finish_stop(matched: int | str | None) -> dict[str, Any]:
    """`matched`: the stop token id, the stop string, or None (no stop condition named)."""
    return {"type": "stop", "matched": matched}


def generate_answer(
    *,
    rid: str,
    text: str,
    prompt_tokens: int,
    output_ids: list[int],
    logprobs: list[float] | None,
    finish: dict[str, Any],
    versions: list[int],
    version_now: int,
    latency: float,
) -> GenerateAnswer:
    """One prompt's answer. `logprobs`: the sampled tokens' log-probs, or None when the request
    did not ask for them; `versions`: one per output token; `version_now`: the engine's version,
    reported when no token was generated."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "weight_version": str(versions[-1] if versions else version_now),
        "weight_versions": version_spans(versions),
        "e2e_latency": latency,
    }
    if logprobs is not None:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(logprobs, output_ids, strict=True)
        ]
        meta["output_token_logprobs_length"] = len(output_ids)
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def version_spans(versions: list[int]) -> list[VersionSpan]:
    """Per-token versions → `[{"version", "start", "end"}]` spans over output-token indices."""
    spans: list[VersionSpan] = []
    for index, version in enumerate(versions):
        if spans and spans[-1]["version"] == str(version):
            spans[-1]["end"] = index + 1
        else:
            spans.append({"version": str(version), "start": index, "end": index + 1})
    return spans


# ---------------------------------------------------------------------- the client's parsing


def parse_generate_answer(out: Any, url: str, parse_version: Callable[[Any], int]) -> GenerateResult:
    """One prompt's answer from `url` (SGLang or engine-server); a malformed one is an
    `EngineServerError` naming what is wrong. `parse_version` turns a version string into an int."""
    tokens, logprobs = _tokens_and_logprobs(out, url)
    meta = out.get("meta_info") or {}
    versions = versions_from_meta(meta, len(tokens), parse_version)
    return GenerateResult(tokens, logprobs, versions, _stop_reason(meta, url))


def _tokens_and_logprobs(out: Any, url: str) -> tuple[list[int], list[float]]:
    if not isinstance(out, dict) or "meta_info" not in out:
        raise EngineServerError(f"engine server {url}/generate sent no meta_info: {str(out)[:200]}")
    triples = out["meta_info"].get("output_token_logprobs")
    ids = out.get("output_ids")
    if triples is None:
        if ids:
            raise EngineServerError(f"engine server {url}/generate sent tokens without output_token_logprobs")
        return [], []  # aborted in the waiting queue: nothing generated
    tokens = [int(t[1]) for t in triples]
    if ids is not None and list(ids) != tokens:
        raise EngineServerError(
            f"engine server {url}/generate: output_ids differ from output_token_logprobs ids"
        )
    # sglang (orjson) writes a -inf log-prob as null, the only non-finite value one can take
    return tokens, [-math.inf if t[0] is None else float(t[0]) for t in triples]


def _stop_reason(meta: dict[str, Any], url: str) -> str:
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind not in FINISH_TYPE_TO_STOP_REASON:
        raise EngineServerError(f"engine server {url}/generate sent an unknown finish_reason {finish!r}")
    return FINISH_TYPE_TO_STOP_REASON[kind]


def versions_from_meta(meta: dict[str, Any], n_tokens: int, parse: Callable[[Any], int]) -> list[int]:
    """One version per output token: from `weight_versions` spans if present (0.5.20+), else the
    single `weight_version` for every token. `parse` turns a version string into an int."""
    spans = meta.get("weight_versions")
    if spans:
        out: list[int | None] = [None] * n_tokens
        for span in spans:
            version = parse(span["version"])
            for i in range(max(0, int(span["start"])), min(n_tokens, int(span["end"]))):
                out[i] = version
        # spans that do not cover every token (e.g. an abort before the span was closed): the
        # gaps take the single version, which is the server's version when the output was sent
        fallback = parse(meta.get("weight_version")) if None in out else 0
        return [fallback if v is None else v for v in out]
    return [parse(meta.get("weight_version"))] * n_tokens

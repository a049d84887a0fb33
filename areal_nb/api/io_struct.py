"""Request/response types shared by every layer (engine, client, proxy, trainer).

Semantics follow AReaL's `io_struct` (docs/reference/areal-semantics.md, "Requests and responses"),
with one deliberate difference: a generation that stopped on a user stop *string* has no
trailing EOS, and `output_tokens_without_stop` returns it unchanged instead of raising.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from areal_nb.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidRequestError,  # noqa: F401 (re-exported)
)

from .constraints import OutputConstraint, SamplingMasks

STOP_REASONS = ("stop", "length", "tool_calls", "abort")

# Sampling limits, checked in one place: `GenerationConfig.check`, which every door calls (the
# capture layer for the proxy and `ArealOpenAI`, the engine-server, `LocalEngine` for a config
# built by hand); a checked config is trusted below the door. A temperature is 0 (greedy) or at
# least MIN_TEMPERATURE: smaller ones turn logits / T into inf in float32 and sampling fails.
# Stop strings are bounded so stop checks stay cheap.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass
class GenerationConfig:
    """Sampling parameters for one request (AReaL's `GenerationHyperparameters`)."""

    n_samples: int = 1
    max_new_tokens: int = 16384
    min_new_tokens: int = 0
    max_tokens: int = 32768  # cap on prompt + generated tokens
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = int(1e8)
    temperature: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    frequency_penalty: float = 0.0
    # structured output: the engine samples only what the constraint allows (api/constraints.py)
    constraint: OutputConstraint | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def __setattr__(self, name: str, value: Any) -> None:
        # any change after `check` makes the config unchecked again, so nobody trusts stale values
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_checked", False)

    @property
    def checked(self) -> bool:
        """Whether `check` passed and no field was assigned since: an engine trusts such a config."""
        return self.__dict__.get("_checked", False)

    def check(self) -> GenerationConfig:
        """Raise `InvalidRequestError` unless every sampling parameter is in its range; return self.

        The one place the sampling ranges are written down; the doors call it, the layers below trust
        a config that passed (`checked`)."""
        t = self.temperature
        if not self.greedy:
            if (
                not isinstance(t, int | float)
                or not math.isfinite(t)
                or (t != 0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)
            ):
                raise InvalidRequestError(
                    f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {t!r}"
                )
            if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:  # NaN fails too
                raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
            if self.top_k == 0 or self.top_k < -1:
                raise InvalidRequestError(f"top_k must be >= 1 (or -1 for no limit), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise InvalidRequestError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.frequency_penalty:
            raise InvalidRequestError(
                f"frequency_penalty is not supported (got {self.frequency_penalty}); send 0 or omit it"
            )
        stops = self.stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}"
            )
        for s in stops:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_STRING_CHARS:
                raise InvalidRequestError(
                    f"stop strings must be non-empty strings of at most {MAX_STOP_STRING_CHARS} characters, got {s!r:.80}"
                )
        if self.constraint is not None:
            self.constraint.check()
        object.__setattr__(self, "_checked", True)
        return self

    def new(self, **kwargs: Any) -> GenerationConfig:
        """A copy with some fields replaced."""
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ArgumentTypeError(f"unknown GenerationConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **kwargs)

    def new_with_stop_and_pad_token_ids(self, tokenizer: Any) -> GenerationConfig:
        return self.new(stop_token_ids=with_pad_and_eos_ids(self.stop_token_ids, tokenizer))

    def to_openai_args_dict(self, api_format: str = "completions") -> dict[str, Any]:
        """Keyword arguments for an OpenAI-style `create` call.

        `api_format` is "completions", "responses" or "openai-agents"; keys that the
        OpenAI API has no equivalent for (greedy, top_k, stop_token_ids, ...) are dropped.
        """
        out: dict[str, Any] = {
            "n": self.n_samples,
            "temperature": 0.0 if self.greedy else self.temperature,
            "top_p": self.top_p,
        }
        if self.stop:
            out["stop"] = list(self.stop)
        if self.frequency_penalty:
            out["frequency_penalty"] = self.frequency_penalty
        key = {
            "completions": "max_completion_tokens",
            "responses": "max_output_tokens",
            "openai-agents": "max_tokens",
        }.get(api_format)
        if key is None:
            raise InvalidArgumentError(f"unknown api_format {api_format!r}")
        out[key] = self.max_new_tokens
        if api_format == "responses":
            out.pop("n")
            out.pop("stop", None)
        return out


@dataclass
class ModelRequest:
    """One generation request: exact prompt token ids plus sampling parameters."""

    input_ids: list[int]
    gconfig: GenerationConfig = field(default_factory=GenerationConfig)
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    # the agent that made the call (the `model` name it sent); an engine serving one adapter per
    # agent (`AgentEngines`) generates with that agent's weights. None: the one policy.
    agent: str | None = None

    def copy(self) -> ModelRequest:
        return ModelRequest(
            input_ids=list(self.input_ids),
            gconfig=self.gconfig.new(),
            rid=self.rid,
            metadata=dict(self.metadata),
            tokenizer=self.tokenizer,
            agent=self.agent,
        )


@dataclass
class ModelResponse:
    """What the engine produced: one log-prob and one policy version per output token."""

    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: str = "stop"
    latency: float = 0.0
    ttft: float = 0.0
    tokenizer: Any = None
    # ids that count as "end of sequence" when stripping; filled from the tokenizer if empty
    eos_token_ids: list[int] = field(default_factory=list)
    # set when some output token was sampled under a mask (grammar, top-k, top-p): how to rebuild it
    sampling_masks: SamplingMasks | None = None

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)

    def _stop_ids(self) -> set[int]:
        ids = set(self.eos_token_ids)
        if self.tokenizer is not None:
            for tid in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id):
                if tid is not None:
                    ids.add(tid)
        if not ids:
            raise InvalidArgumentError(
                "ModelResponse needs a tokenizer or eos_token_ids to know its stop tokens"
            )
        return ids

    @property
    def end_with_stop(self) -> bool:
        return bool(self.output_tokens) and self.output_tokens[-1] in self._stop_ids()

    @property
    def output_tokens_without_stop(self) -> list[int]:
        """Output tokens with the trailing run of EOS/pad tokens removed.

        Truncated ("length"/"abort") outputs and outputs that stopped on a stop string
        (no trailing EOS) are returned unchanged.
        """
        if self.stop_reason in ("length", "abort") or not self.output_tokens:
            return list(self.output_tokens)
        stop_ids = self._stop_ids()
        end = len(self.output_tokens)
        while end > 0 and self.output_tokens[end - 1] in stop_ids:
            end -= 1
        return list(self.output_tokens[:end])


def with_pad_and_eos_ids(stop_token_ids: Any, tokenizer: Any) -> list[int]:
    """`stop_token_ids` and then the tokenizer's pad and EOS ids, each id once."""
    ids = list(stop_token_ids)
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids

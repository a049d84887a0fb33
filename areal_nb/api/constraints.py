"""Output constraints: what a structured-output request allows the model to write, and the grammar
matcher that turns one into the set of tokens allowed at each step.

An `OutputConstraint` is plain data (it travels in a `GenerationConfig` and in a recorded
`SamplingMasks`). `TokenGrammar` runs it with llguidance over one tokenizer: the engine asks it
for the allowed set before sampling each token, and the trainer replays the same constraint over
the recorded output to rebuild every step's allowed set (`_allowed_masks`), so nothing the size of
the vocabulary has to be stored per token.

Why llguidance: it is a self-contained CPU wheel (no torch, CUDA or triton dependency, unlike
xgrammar 0.2.8, which requires triton on Linux), computes a mask in tens of microseconds on the
tiny tokenizer, and names the JSON-schema keywords it does not implement, which is what a 400
has to say.

JSON is written compactly but readably, as `json.dumps` does: `", "` between items, `": "` after
keys, no other whitespace. That keeps the mask small where freedom buys nothing.

This module is in `api` because the capture layer (door checks), the engine (sampling) and the
trainer (replay) all need the same rule; llguidance is imported only when a constraint is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from areal_nb.errors import InvalidArgumentError, InvalidRequestError

if TYPE_CHECKING:
    import torch
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

_ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "tool_call", "any_tool_call"]
CONSTRAINT_KINDS: tuple[str, ...] = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "tool_call",
    "any_tool_call",
)

# the separators json.dumps uses by default; no free whitespace
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# the Qwen/Hermes tool-call block that the capture layer's tool-call parser reads
_TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")


def _tag(text: str, tokenizer: Any) -> str:
    """A tag in lark: the token itself where the tokenizer has it as one added token (llguidance
    matches added tokens by id, not by their text), else the literal text."""
    added: dict[str, int] = getattr(tokenizer, "get_added_vocab", dict)() if tokenizer is not None else {}
    return f"<[{added[text]}]>" if text in added else json.dumps(text)


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class OutputConstraint:
    """What the reply may be:

    - `json_schema`: JSON matching `schema`; `json_object`: any JSON object;
    - `regex`: text matching `pattern` (whole); `choice`: exactly one of the strings `choices`;
    - `tool_call`: one call of the function `name`, its arguments matching `schema`;
    - `any_tool_call`: one call of any of `functions` (name → parameters schema), its arguments
      matching that function's schema.
    """

    kind: _ConstraintKind
    schema: dict[str, Any] | None = None
    pattern: str | None = None
    name: str | None = None
    choices: tuple[str, ...] | None = None
    functions: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (
                ("kind", self.kind),
                ("schema", self.schema),
                ("pattern", self.pattern),
                ("name", self.name),
                ("choices", None if self.choices is None else list(self.choices)),
                ("functions", self.functions),
            )
            if v is not None
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputConstraint:
        choices = data.get("choices")
        return cls(
            kind=data["kind"],
            schema=data.get("schema"),
            pattern=data.get("pattern"),
            name=data.get("name"),
            choices=None if choices is None else tuple(choices),
            functions=data.get("functions"),
        )

    def grammar(self, tokenizer: Any = None) -> str:
        """The llguidance grammar text of this constraint (`tokenizer`: the one it will run with)."""
        import llguidance

        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self.schema or {}, defaults=_JSON_OPTIONS)
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.pattern or "")
        if self.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(_lark_string(c) for c in self.choices or ()) + "\n"
            )
        if self.kind == "tool_call":
            return _tool_call_grammar({self.name or "": self.schema}, tokenizer)
        if self.kind == "any_tool_call":
            return _tool_call_grammar(self.functions or {}, tokenizer)
        raise InvalidRequestError(
            f"unknown output constraint kind {self.kind!r}; expected one of {CONSTRAINT_KINDS}"
        )

    def check(self) -> OutputConstraint:
        """Raise `InvalidRequestError` naming what the grammar library cannot do; return self."""
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidRequestError(
                f"unknown output constraint kind {self.kind!r}; expected one of {CONSTRAINT_KINDS}"
            )
        if (
            self.kind in ("json_schema", "tool_call")
            and self.schema is not None
            and not isinstance(self.schema, dict)
        ):
            raise InvalidRequestError(f"a JSON schema must be an object, got {type(self.schema).__name__}")
        if self.kind == "regex" and not isinstance(self.pattern, str):
            raise InvalidRequestError("a regex constraint needs a pattern string")
        if self.kind == "tool_call" and not isinstance(self.name, str):
            raise InvalidRequestError("a tool_call constraint needs the function's name")
        if self.kind == "choice" and (
            not self.choices or not all(isinstance(c, str) and c for c in self.choices)
        ):
            raise InvalidRequestError(
                f"a choice constraint needs non-empty strings, got {self.choices!r:.80}"
            )
        if self.kind == "any_tool_call":
            if not self.functions:
                raise InvalidRequestError("an any_tool_call constraint needs at least one function")
            for name, schema in self.functions.items():  # each alone, so the error names its function
                if schema is not None and not isinstance(schema, dict):
                    raise InvalidRequestError(f"the parameters of {name!r} must be a JSON schema object")
                _enforceable(
                    OutputConstraint("tool_call", name=name, schema=schema),
                    f"parameters schema of the tool {name!r}",
                )
            return self
        what = {
            "json_schema": "JSON schema",
            "json_object": "JSON object",
            "regex": "regex",
            "choice": "choice",
            "tool_call": f"parameters schema of the tool {self.name!r}",
        }[self.kind]
        _enforceable(self, what)
        return self


def _enforceable(constraint: OutputConstraint, what: str) -> None:
    import llguidance

    try:
        error = llguidance.LLMatcher.validate_grammar(constraint.grammar(), None)
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error and not error.startswith("WARNING"):
        raise InvalidRequestError(f"the {what} cannot be enforced by constrained decoding: {error[:300]}")


def _tool_call_grammar(functions: Mapping[str, dict[str, Any] | None], tokenizer: Any) -> str:
    """One `<tool_call>` block calling one of `functions`, written as the Qwen/Hermes templates
    write it: the open tag, `\\n{"name": "f", "arguments": {...}}\\n`, the close tag."""
    import llguidance

    open_tag, close_tag = (_tag(t, tokenizer) for t in _TOOL_CALL_TAGS)
    rules = []
    for i, (name, parameters) in enumerate(functions.items()):
        schema = dict(parameters or {"type": "object"})
        schema.setdefault("x-guidance", _JSON_OPTIONS)
        head = '\n{"name": ' + json.dumps(name) + ', "arguments": '
        rules += [f"call_{i}: {_lark_string(head)} args_{i}", f"args_{i}: %json {json.dumps(schema)}"]
    calls = " | ".join(f"call_{i}" for i in range(len(functions)))
    start = f"start: {open_tag} ({calls}) {_lark_string('}' + chr(10))} {close_tag}"
    return llguidance.LLMatcher.grammar_from_lark("\n".join([start, *rules]) + "\n")


@lru_cache(maxsize=8)
def _ll_tokenizer(tokenizer: Any, vocab_size: int) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (~30 ms to build: kept per tokenizer)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)


class TokenGrammar:
    """One output's grammar state: `allowed()` before each token, `advance(token)` after it."""

    def __init__(self, constraint: OutputConstraint, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import torch

        self.vocab_size = vocab_size
        self._matcher = llguidance.LLMatcher(
            _ll_tokenizer(tokenizer, vocab_size), constraint.grammar(tokenizer), log_level=0
        )
        if self._matcher.is_error():
            raise InvalidRequestError(
                f"the output constraint cannot be compiled: {self._matcher.get_error()[:300]}"
            )
        self._bits = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)

    def allowed(self) -> torch.Tensor:
        """bool [vocab_size]: the tokens the grammar allows next (EOS once the output is complete)."""
        import torch

        packed = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.uint8)
        return ((packed[:, None] & self._bits) != 0).flatten()[: self.vocab_size]

    def advance(self, token: int) -> bool:
        """Consume `token`; False if the grammar did not allow it (the matcher is then stopped)."""
        return bool(self._matcher.consume_token(int(token)))

    @property
    def done(self) -> bool:
        return bool(self._matcher.is_stopped())


def _allowed_masks(
    constraint: OutputConstraint, tokens: list[int], tokenizer: Any, vocab_size: int
) -> torch.Tensor:
    """bool [len(tokens), vocab_size]: the grammar's allowed set before each of `tokens`, replayed."""
    import torch

    grammar = TokenGrammar(constraint, tokenizer, vocab_size)
    rows = []
    for position, token in enumerate(tokens):
        rows.append(grammar.allowed())
        if not grammar.advance(token):
            raise InvalidArgumentError(
                f"token {token} at output position {position} does not satisfy the constraint"
            )
    return torch.stack(rows) if rows else torch.zeros(0, vocab_size, dtype=torch.bool)


@dataclass
class SamplingMasks:
    """How each output token of one response was sampled, enough to rebuild its distribution.

    Per token `i`: the allowed set is `kept[i]` (token ids: what top-k / top-p / `min_new_tokens`
    left, after the grammar) when it is not None, else the grammar's allowed set replayed from
    `constraint` (`_allowed_masks`), else the whole vocabulary. `logprobs[i]` is the token's
    log-prob under the distribution it was sampled from: `log_softmax(logits / T)` over the
    allowed set. (The response's `output_logprobs` keep the full-vocabulary value, which is what a
    trainer recomputes without replay.)
    """

    constraint: OutputConstraint | None
    kept: list[list[int] | None]
    logprobs: list[float]

    def masked(self, i: int) -> bool:
        return self.constraint is not None or self.kept[i] is not None

    def allowed(self, tokens: list[int], tokenizer: Any, vocab_size: int) -> torch.Tensor:
        """bool [len(tokens), vocab_size]: each output token's allowed set."""
        import torch

        if self.constraint is not None:
            masks = _allowed_masks(self.constraint, tokens, tokenizer, vocab_size)
        else:
            masks = torch.ones(len(tokens), vocab_size, dtype=torch.bool)
        for i, kept in enumerate(self.kept):
            if kept is not None:
                masks[i] = False
                masks[i, kept] = True
        return masks


@dataclass
class SamplingSpan:
    """One call's masked sampling inside a training row: its output tokens start at row position
    `start`; `masks` says how each was sampled. What the export carries to the trainer."""

    start: int
    masks: SamplingMasks
    tokens: list[int]

    def positions(self, row_len: int) -> list[tuple[int, int]]:
        """(output index, row position) of the span's masked tokens that lie in a row of `row_len`."""
        return [
            (i, self.start + i)
            for i in range(len(self.tokens))
            if self.start + i < row_len and self.masks.masked(i)
        ]

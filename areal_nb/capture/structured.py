"""Structured output at the doors: a request's `response_format` (chat), `text.format`
(Responses), `output_config.format` (Anthropic Messages), a `tool_choice` naming one function or
requiring some tool call, or the regex / choice / JSON options of vLLM and SGLang servers, as the
`OutputConstraint` the engine decodes under, and the instruction that shows the model the schema.

OpenAI's semantics: with `json_schema` the reply is JSON matching the schema; with `json_object`
it is some JSON object (the prompt itself has to ask for JSON, as OpenAI requires); a
`tool_choice` naming a function makes the reply one call of that function, its arguments
matching the function's `parameters`; `tool_choice="required"` (Anthropic: `{"type": "any"}`)
makes it one call of any of the tools. Here all of them are enforced by constrained decoding
(`api.constraints`), and the model also *sees* the schema: it is added to the system message
(`with_format_instruction`), because a model sampled under a mask it cannot see learns nothing
about why. Tools are already in the prompt through the chat template, so a forced tool call adds
no text; regex and choice add none either (as on the servers that offer them, the prompt is the
caller's to write). The instruction is part of the rendered prompt, so it is in the recorded
input tokens; the interaction keeps the caller's messages (a later turn finds its parent by them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from areal_nb.api import InvalidRequestError, OutputConstraint

from .messages import CompletionRequestError, with_system_text

FORMAT_INSTRUCTION = "Respond only with a JSON value that matches this JSON schema:\n"


def _constraint_or_400(constraint: OutputConstraint, where: str) -> OutputConstraint:
    try:
        return constraint.check()
    except InvalidRequestError as exc:
        raise CompletionRequestError(f"{where}: {exc}") from None


def constraint_of_format(fmt: Any, where: str) -> OutputConstraint | None:
    """A chat `response_format` or a Responses `text.format` (their shapes differ only in where
    the schema sits: `json_schema.schema` vs `schema`)."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise CompletionRequestError(
            f"{where} must be an object like {{'type': 'json_schema', ...}}, got {fmt!r:.80}"
        )
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return _constraint_or_400(OutputConstraint("json_object"), where)
    if kind == "json_schema":
        spec = fmt.get("json_schema", fmt)  # chat nests it, Responses does not
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise CompletionRequestError(f"{where} json_schema needs a 'schema' object")
        return _constraint_or_400(OutputConstraint("json_schema", schema=dict(schema)), where)
    raise CompletionRequestError(
        f"{where} type {kind!r} is not supported: use 'text', 'json_object' or 'json_schema'"
    )


def constraint_of_tool_choice(
    tools: list[dict[str, Any]] | None, tool_choice: Any
) -> OutputConstraint | None:
    """A `tool_choice` naming one function (chat or Responses form) or `"required"` (a call of any
    of the tools); `check_tools` ran before."""
    if tool_choice == "required" and tools:
        functions = {
            tool["function"]["name"]: dict(tool["function"].get("parameters") or {"type": "object"})
            for tool in tools
        }
        return _constraint_or_400(OutputConstraint("any_tool_call", functions=functions), "tool_choice")
    if not isinstance(tool_choice, Mapping) or not tools:
        return None
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
    for tool in tools:
        function = tool.get("function", {})
        if function.get("name") == name:
            parameters = function.get("parameters") or {"type": "object"}
            return _constraint_or_400(
                OutputConstraint("tool_call", name=name, schema=dict(parameters)), "tool_choice"
            )
    return None


# Where clients of vLLM and SGLang servers ask for regex, choice or JSON output, by the OpenAI
# SDK's `extra_body=` (which puts them at the top level of the request body): vLLM's
# `structured_outputs` and its older `guided_*` parameters, SGLang's `regex`.
GUIDED_KEYS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "regex",
    "ebnf",
)
_NO_GRAMMARS = (
    "is not supported: grammars in other syntaxes are not translated; use a regex, a choice or a JSON schema"
)


def _guided_json(value: Any, where: str) -> OutputConstraint:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise CompletionRequestError(
                f"{where} must be a JSON schema (an object or its JSON text)"
            ) from None
    if not isinstance(value, Mapping):
        raise CompletionRequestError(f"{where} must be a JSON schema object, got {value!r:.80}")
    return OutputConstraint("json_schema", schema=dict(value))


def _guided_choice(value: Any, where: str) -> OutputConstraint:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise CompletionRequestError(
            f"{where} must be a non-empty list of non-empty strings, got {value!r:.80}"
        )
    return OutputConstraint("choice", choices=tuple(value))


def _guided_regex(value: Any, where: str) -> OutputConstraint:
    if not isinstance(value, str) or not value:
        raise CompletionRequestError(f"{where} must be a regex string, got {value!r:.80}")
    return OutputConstraint("regex", pattern=value)


# each option as the kind of constraint it asks for (vLLM's `structured_outputs` names its kind inside)
_GUIDED_KINDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "ebnf": "grammar",
}
_STRUCTURED_OUTPUTS_KINDS = ("json", "regex", "choice", "json_object", "grammar", "structural_tag")


def constraint_of_guided(options: Any) -> dict[str, OutputConstraint]:
    """`{option name: its constraint}` for the `GUIDED_KEYS` option set in `options` (a request's
    extra fields; not a dict: none), or `{}`."""
    if not isinstance(options, Mapping):
        return {}
    given = {key: options[key] for key in GUIDED_KEYS if options.get(key) is not None}
    if len(given) > 1:
        raise CompletionRequestError(
            f"{' and '.join(given)} cannot both constrain one reply; send one of them"
        )
    if not given:
        return {}
    ((where, spec),) = given.items()
    if where == "structured_outputs":
        if not isinstance(spec, Mapping):
            raise CompletionRequestError(f"structured_outputs must be an object, got {spec!r:.80}")
        kinds = {k: v for k, v in spec.items() if k in _STRUCTURED_OUTPUTS_KINDS and v not in (None, False)}
        if len(kinds) != 1:
            raise CompletionRequestError(
                "structured_outputs needs exactly one of json, regex, choice or json_object, "
                f"got {sorted(kinds) or 'none'}"
            )
        ((kind, spec),) = kinds.items()
        where = f"structured_outputs.{kind}"
    else:
        kind = _GUIDED_KINDS[where]
    if kind in ("grammar", "structural_tag"):
        raise CompletionRequestError(f"{where} {_NO_GRAMMARS}")
    if kind == "json_object":
        constraint = OutputConstraint("json_object")
    else:
        constraint = {"json": _guided_json, "regex": _guided_regex, "choice": _guided_choice}[kind](
            spec, where
        )
    return {where: _constraint_or_400(constraint, where)}


def request_constraint(sources: Mapping[str, OutputConstraint | None]) -> OutputConstraint | None:
    """The one constraint of a request, from its sources by option name (`response_format`,
    `tool_choice`, what `constraint_of_guided` found); two at once are a 400 naming both."""
    given = {name: constraint for name, constraint in sources.items() if constraint is not None}
    if len(given) > 1:
        raise CompletionRequestError(
            f"{' and '.join(given)} cannot both constrain one reply; send one of them"
        )
    return next(iter(given.values()), None)


def with_format_instruction(
    messages: list[dict[str, Any]], constraint: OutputConstraint | None
) -> list[dict[str, Any]]:
    """The messages the template renders: the schema appended to the system message (one is
    added first if there is none, or if its content is not plain text)."""
    if constraint is None or constraint.kind != "json_schema":
        return messages
    return with_system_text(messages, FORMAT_INSTRUCTION + json.dumps(constraint.schema))

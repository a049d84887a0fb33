"""Structured output at the doors: a request's `response_format` (chat), `text.format`
(Responses) or a `tool_choice` naming one function, as the `OutputConstraint` the engine decodes
under, and the instruction that shows the model the schema.

OpenAI's semantics: with `json_schema` the reply is JSON matching the schema; with `json_object`
it is some JSON object (the prompt itself has to ask for JSON, as OpenAI requires); a
`tool_choice` naming a function makes the reply one call of that function, its arguments
matching the function's `parameters`. Here all three are enforced by constrained decoding
(`api.constraints`), and the model also *sees* the schema: it is added to the system message
(`with_format_instruction`), because a model sampled under a mask it cannot see learns nothing
about why. Tools are already in the prompt through the chat template, so a forced tool call adds
no text. The instruction is part of the rendered prompt, so it is in the recorded input tokens;
the interaction keeps the caller's messages (a later turn finds its parent by them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from areal_nb.api import InvalidRequestError, OutputConstraint

from .messages import CompletionRequestError

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
        raise CompletionRequestError(f"{where} must be an object like {{'type': 'json_schema', ...}}, got {fmt!r:.80}")
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
    raise CompletionRequestError(f"{where} type {kind!r} is not supported: use 'text', 'json_object' or 'json_schema'")


def constraint_of_tool_choice(tools: list[dict[str, Any]] | None, tool_choice: Any) -> OutputConstraint | None:
    """A `tool_choice` naming one function (chat or Responses form; `check_tools` ran before)."""
    if not isinstance(tool_choice, Mapping) or not tools:
        return None
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
    for tool in tools:
        function = tool.get("function", {})
        if function.get("name") == name:
            parameters = function.get("parameters") or {"type": "object"}
            return _constraint_or_400(OutputConstraint("tool_call", name=name, schema=dict(parameters)), "tool_choice parameters")
    return None


def request_constraint(fmt: OutputConstraint | None, forced_tool: OutputConstraint | None) -> OutputConstraint | None:
    if fmt is not None and forced_tool is not None:
        raise CompletionRequestError("a structured response format and a tool_choice naming a function cannot both "
                                     "constrain one reply; send one of them")
    return fmt or forced_tool


def with_format_instruction(messages: list[dict[str, Any]], constraint: OutputConstraint | None) -> list[dict[str, Any]]:
    """The messages the template renders: the schema appended to the system message (one is
    added first if there is none, or if its content is not plain text)."""
    if constraint is None or constraint.kind != "json_schema":
        return messages
    instruction = FORMAT_INSTRUCTION + json.dumps(constraint.schema)
    first = messages[0] if messages else None
    if first is not None and first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]

"""Checks on a request's tool definitions and `tool_choice`, after each door converted them to
chat-completion form (`{"type": "function", "function": {"name", "description", "parameters"}}`).

A chat template renders whatever it is given: a tool without a name, a schema that is a string or
a tool of a type the model was never shown would be rendered into the prompt as garbage, and a
`tool_choice` naming no tool asks for something the engine cannot do. Each is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .messages import CompletionRequestError


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.get("type", "function") != "function":
            raise CompletionRequestError(f"{where}.type must be 'function', got {tool.get('type')!r:.80}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise CompletionRequestError(f"{where}.function must be an object with a name")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise CompletionRequestError(
                f"{where}.function.name must be a non-empty string, got {fn.get('name')!r:.80}"
            )
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise CompletionRequestError(f"{where}.function.description must be a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            raise CompletionRequestError(f"{where}.function.parameters must be a JSON Schema object")
        names.append(fn["name"])
    return names


def check_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> None:
    """`tools` (chat form, normalised) and `tool_choice` (chat or Responses form) agree."""
    names = _tool_names(tools or [])
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if not names:
        raise CompletionRequestError(f"tool_choice {tool_choice!r:.80} needs tools; none were given")
    if tool_choice == "required":
        return
    if not isinstance(tool_choice, Mapping):
        raise CompletionRequestError(
            f"tool_choice must be 'none', 'auto', 'required' or a function, got {tool_choice!r:.80}"
        )
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")  # chat / Responses form
    if name not in names:
        raise CompletionRequestError(
            f"tool_choice names the function {name!r:.80}, which is not among the tools {names}"
        )

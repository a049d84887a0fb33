"""Checks on a request's tool definitions and `tool_choice`, after each door converted them to
chat-completion form (`{"type": "function", "function": {"name", "description", "parameters"}}`).

A chat template renders whatever it is given: a tool without a name, a schema that is a string or
a tool of a type the model was never shown would be rendered into the prompt as garbage, and a
`tool_choice` naming no tool asks for something the engine cannot do. Each is a 400 naming the field.

A template with no tool syntax is shown the tools as text in the system message
(`with_tools_section`), the way a structured-output schema is shown (`structured.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .messages import CompletionRequestError, with_system_text


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


# ---------------------------------------------------------------------------------- templates without tools
# A chat template that never reads `tools` (SmolLM2's, many base models') would drop them from the
# prompt without a word, and the model would be trained on calls it was never shown how to make.
# Such a template gets the tools the way structured output shows a schema: as text in the system
# message, in the Hermes / Qwen2.5 form the default tool-call parser reads back (`tool_calls.py`),
# and earlier calls of the conversation as the `<tool_call>` blocks the model wrote.
TOOLS_SECTION_START = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_SECTION_END = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_renders_tools(chat_template: Any) -> bool:
    """Whether a chat template reads `tools` at all (a template that is not one string: assume so)."""
    return not isinstance(chat_template, str) or re.search(r"\btools\b", chat_template) is not None


def with_tools_section(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages a template without tool syntax renders: the tools appended to the system
    message (one is added if there is none, or if its content is not plain text) and each
    assistant tool call as its `<tool_call>` block in the message's text."""
    section = TOOLS_SECTION_START + "".join("\n" + json.dumps(tool) for tool in tools) + TOOLS_SECTION_END
    shown = [
        _calls_as_text(m) if m.get("role") == "assistant" and m.get("tool_calls") else m for m in messages
    ]
    return with_system_text(shown, section)


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    blocks = []
    for call in message["tool_calls"]:
        fn = call.get("function", call)
        arguments = fn.get("arguments")
        arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        blocks.append(
            f'<tool_call>\n{{"name": "{fn.get("name")}", "arguments": {arguments_json}}}\n</tool_call>'
        )
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    shown = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**shown, "content": "\n".join([text, *blocks] if text else blocks)}

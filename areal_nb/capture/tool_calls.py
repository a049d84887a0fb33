"""Parse Qwen/Hermes-style `<tool_call>{json}</tool_call>` blocks from generated text.

No SGLang or vLLM needed. Only the text after the reasoning block (`<think>…</think>`) is
scanned: a tool call the model merely thought about stays in the text. If any block is not
valid JSON with a `name`, nothing is parsed and the text is returned unchanged.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from areal_nb.errors import InvalidArgumentError

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SUPPORTED_TOOL_CALL_PARSERS = ("qwen", "qwen25", "qwen3", "hermes")
SUPPORTED_REASONING_PARSERS = ("qwen3", "deepseek-r1", "none")


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as in the OpenAI API


def _split_reasoning(text: str, reasoning_parser: str = "qwen3") -> tuple[str, str]:
    """(reasoning part incl. tags, content part); without a closing tag all is reasoning."""
    if reasoning_parser == "none":
        return "", text
    close = text.find(THINK_CLOSE)
    if close >= 0:
        end = close + len(THINK_CLOSE)
        return text[:end], text[end:]
    start = text.find(THINK_OPEN)
    if start >= 0:
        return text[start:], text[:start]
    return "", text


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(
    text: str, tool_call_parser: str = "qwen", reasoning_parser: str = "qwen3"
) -> tuple[list[ParsedToolCall], str]:
    """(tool calls, text without the tool-call markup); ([], text) when there are none."""
    if tool_call_parser not in SUPPORTED_TOOL_CALL_PARSERS:
        raise InvalidArgumentError(
            f"unknown tool_call_parser {tool_call_parser!r}; supported: {SUPPORTED_TOOL_CALL_PARSERS}"
        )
    if reasoning_parser not in SUPPORTED_REASONING_PARSERS:
        raise InvalidArgumentError(
            f"unknown reasoning_parser {reasoning_parser!r}; supported: {SUPPORTED_REASONING_PARSERS}"
        )
    reasoning, content = _split_reasoning(text, reasoning_parser)
    if reasoning and THINK_CLOSE not in reasoning:  # unfinished thinking: no content to scan
        return [], text
    calls: list[ParsedToolCall] = []
    for block in _TOOL_CALL_RE.findall(content):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            return [], text
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return [], text
        args = obj.get("arguments", obj.get("parameters", {}))
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(ParsedToolCall(id=_new_call_id(), name=obj["name"], arguments=arguments))
    if not calls:
        return [], text
    remaining = _TOOL_CALL_RE.sub("", content).rstrip()
    # keep the separator the model wrote after </think>; without reasoning, trim both ends
    return calls, reasoning + remaining if reasoning else remaining.lstrip()


def tool_calls_to_openai(calls: list[ParsedToolCall]) -> list[Any]:
    from openai.types.chat.chat_completion_message_function_tool_call import (
        ChatCompletionMessageFunctionToolCall,
        Function,
    )

    return [
        ChatCompletionMessageFunctionToolCall(
            id=c.id, type="function", function=Function(name=c.name, arguments=c.arguments)
        )
        for c in calls
    ]

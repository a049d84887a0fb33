"""What a `verifiers` environment's client received and what the proxy recorded, in one form to
compare call by call: a reply's text and its tool calls (name, arguments). Shared by the tests of
both `verifiers` stacks (it imports neither)."""

from __future__ import annotations

import json
import re


def last_number(text: str | None) -> int | None:
    numbers = re.findall(r"-?\d+", text or "")
    return int(numbers[-1]) if numbers else None


def seen_message(message) -> tuple[str, list]:
    """An assistant message the environment received: its text and its tool calls."""
    calls = [(c.name, json.loads(c.arguments)) for c in message.tool_calls or []]
    return (message.content or "").strip(), calls


def recorded_by_proxy(tok, call) -> tuple[str, list]:
    """The same for a call the proxy recorded, read from the recorded output tokens alone (a tool
    call in the tiny models' `<tool_call>{"name", "arguments"}</tool_call>` form)."""
    text = tok.decode(call.model_response.output_tokens, skip_special_tokens=True)
    if call.completion.choices[0].message.tool_calls:
        calls = [json.loads(m) for m in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S)]
        return "", [(c["name"], c["arguments"]) for c in calls]
    return text.strip(), []

"""A `verifiers` harness that runs its chat loop in-process: each model call goes to the episode's
interception endpoint with the rollout's secret (the harness contract of `verifiers.v1`), and
the function tools it is given run here. No program is installed, so an episode needs no
network."""

from __future__ import annotations

import json
from collections.abc import Callable

import verifiers.v1 as vf
from openai import APIStatusError, AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.compaction import is_context_overflow

MAX_CALLS = 4


def wire(data: vf.TaskData, harness: vf.Harness) -> list[dict]:
    system, prompt = harness.resolve_prompt(data)
    messages = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    else:
        messages.extend(message_to_wire(m) for m in prompt or [])
    return messages


class ChatHarness(vf.Harness[vf.HarnessConfig]):
    """One reply per segment, or a tool loop when `TOOLS` names functions: the model's tool calls
    run here and their results go back until it answers in text (at most `MAX_CALLS` calls). A
    call that overflows the model's context (verifiers' own check) ends the run with the
    conversation so far, as verifiers' bundled chat program does."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    TOOLS: dict[str, tuple[dict, Callable[..., str]]] = {}

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        messages = wire(data, self)
        tools = [{"type": "function", "function": spec} for spec, _ in self.TOOLS.values()]
        try:
            for _ in range(MAX_CALLS):
                try:
                    completion = await client.chat.completions.create(
                        model=ctx.model, messages=messages, **({"tools": tools} if tools else {})
                    )
                except APIStatusError as error:
                    if not is_context_overflow(error):
                        raise
                    break
                message = completion.choices[0].message
                if not message.tool_calls:
                    break
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls:
                    name = call.function.name
                    try:
                        result = self.TOOLS[name][1](**json.loads(call.function.arguments or "{}"))
                    except Exception as exc:  # the model's mistake is the tool's answer
                        result = f"error: {exc}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

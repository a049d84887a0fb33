"""A `verifiers` harness that talks to the model through the OpenAI Responses API (one reply per
segment), in-process like `vf_chat.ChatHarness`: a seat whose calls go to the Responses door."""

from __future__ import annotations

import verifiers.v1 as vf
from openai import AsyncOpenAI
from vf_chat import wire


class ResponsesHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            await client.responses.create(model=ctx.model, input=wire(data, self))
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ResponsesHarness"]

"""Helpers shared by the engine tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from areal_nb.testing import ServedStub  # noqa: F401 - the engine tests import it from here


def teacher_forced_logprobs(
    model, prompt: list[int], output: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """log_softmax(logits / T) of each output token, from one unpadded forward over prompt + output."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1)


def max_logprob_error(model, response, temperature: float = 1.0) -> float:
    ref = teacher_forced_logprobs(model, response.input_tokens, response.output_tokens, temperature)
    return float((ref - torch.tensor(response.output_logprobs)).abs().max())


async def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll `condition` from the event loop (the engine works in its own thread)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)

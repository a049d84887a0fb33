"""`sample_batch`: a GRPO training batch straight from an engine, without the proxy.

For tests of the trainer against a real engine (embedded or on servers): sample
`n_samples` completions of each prompt and lay the responses out as the capture layer does
— prompt + output ids, `loss_mask` on the output, the engine's log-probs and weight versions
on the output tokens (-1 elsewhere), one reward per row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch

from areal_nb.api import GenerationConfig, InferenceEngine, ModelRequest, ModelResponse
from areal_nb.errors import InvalidArgumentError


def sample_batch(
    engine: InferenceEngine,
    prompts: Sequence[Sequence[int]],
    gconfig: GenerationConfig,
    reward: Callable[[ModelResponse], float],
    n_samples: int = 1,
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """(batch, group_ids): rows grouped by prompt, `group_ids[i]` the prompt index of row i.

    Runs its own event loop (`asyncio.run`), so call it from synchronous test code.
    """

    async def run() -> list[ModelResponse]:
        requests = [
            ModelRequest(input_ids=list(p), gconfig=gconfig) for p in prompts for _ in range(n_samples)
        ]
        return await asyncio.gather(*(engine.agenerate(r) for r in requests))

    responses = asyncio.run(run())
    return responses_to_batch(responses, [reward(r) for r in responses]), [
        i // n_samples for i in range(len(responses))
    ]


def responses_to_batch(
    responses: Sequence[ModelResponse], rewards: Sequence[float]
) -> dict[str, torch.Tensor]:
    """The right-padded training tensors of `responses` (one row each) with their `rewards`."""
    if len(rewards) != len(responses):
        raise InvalidArgumentError(f"{len(responses)} responses but {len(rewards)} rewards")
    rows, width = len(responses), max(r.input_len + r.output_len for r in responses)
    batch = {
        "input_ids": torch.zeros(rows, width, dtype=torch.long),
        "attention_mask": torch.zeros(rows, width, dtype=torch.bool),
        "loss_mask": torch.zeros(rows, width, dtype=torch.long),
        "logprobs": torch.zeros(rows, width, dtype=torch.float32),
        "versions": torch.full((rows, width), -1, dtype=torch.long),
    }
    for i, r in enumerate(responses):
        n_in, n = r.input_len, r.input_len + r.output_len
        batch["input_ids"][i, :n] = torch.tensor(r.input_tokens + r.output_tokens)
        batch["attention_mask"][i, :n] = True
        batch["loss_mask"][i, n_in:n] = 1
        batch["logprobs"][i, n_in:n] = torch.tensor(r.output_logprobs)
        batch["versions"][i, n_in:n] = torch.tensor(r.output_versions)
    batch["rewards"] = torch.tensor([float(x) for x in rewards])
    return batch

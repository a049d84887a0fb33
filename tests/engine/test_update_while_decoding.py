"""Async RL's engine case: weights pushed while rows decode. Requests that join the running batch
after the update (a prefetched episode's next turn, a new group) must be sampled by the new
weights alone, and report their log-probs: the behaviour policy the decoupled loss divides by."""

from __future__ import annotations

import asyncio

import torch
from engine_test_helpers import max_logprob_error, wait_until

from areal_nb.api import GenerationConfig, ModelRequest

PROMPTS = ([5, 17, 42, 99, 7, 31], [8, 3, 64, 12], [21, 9, 9, 40, 2, 77, 13])


def _perturbed(model, scale: float = 0.05, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def test_requests_joining_a_running_batch_after_an_update_use_only_the_new_weights(engine, reference_model):
    new_weights = _perturbed(reference_model)
    new_model = type(reference_model)(reference_model.config).eval()
    new_model.load_state_dict(new_weights)

    async def run():
        long = asyncio.create_task(
            engine.agenerate(
                ModelRequest(list(PROMPTS[0]), GenerationConfig(max_new_tokens=200, ignore_eos=True))
            )
        )
        await wait_until(lambda: engine.stats.decode_steps >= 3)
        await asyncio.to_thread(engine.update_weights, new_weights, 7)
        # two requests that arrive together (one packed prefill) while the long row still decodes
        joining = [
            asyncio.create_task(
                engine.agenerate(ModelRequest(list(p), GenerationConfig(max_new_tokens=12, ignore_eos=True)))
            )
            for p in PROMPTS[1:]
        ]
        done = await asyncio.gather(*joining)
        assert not long.done()  # they shared decoding steps with the row from before the update
        return done, await long

    joined, long = asyncio.run(run())
    for resp in joined:
        assert resp.output_versions == [7] * 12
        assert max_logprob_error(new_model, resp) <= 1e-4  # no projection copy of the old weights left
    assert long.output_versions[0] == 0 and long.output_versions[-1] == 7

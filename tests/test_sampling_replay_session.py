"""`actor.replay_sampling_masks` end to end: a Session's agent samples with top-k, top-p and a JSON
schema through the proxy; the export carries each masked token's record to the Actor, whose
recomputation (same weights, before the step) equals the engine's log-probs under the sampled
distribution, while the full-vocabulary recomputation visibly does not."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.config import ConfigError, load_config
from areal_nb.train.step_batch import prepare_step

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = ["rollout.batch_size=2", "rollout.group_size=2", "logging.progress=false", "rollout.prefetch=false"]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["answer"],
    "additionalProperties": False,
}
# one call per episode, the sampling taking turns: top_k=2, top_p=0.7, a JSON schema
SAMPLINGS = [
    {"extra_body": {"top_k": 2}},
    {"top_p": 0.7},
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": ANSWER, "strict": True},
        }
    },
]


class SampledAgent:
    def __init__(self) -> None:
        self.turn = itertools.count()

    async def run(self, data, base_url, api_key, **_):
        from openai import AsyncOpenAI

        kind = next(self.turn) % len(SAMPLINGS)
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        reply = await client.chat.completions.create(
            model="m", messages=data["messages"], max_tokens=24, temperature=1.0, **SAMPLINGS[kind]
        )
        text = reply.choices[0].message.content or ""
        if kind == 2 and reply.choices[0].finish_reason == "stop":
            json.loads(text)  # a complete reply under the schema parses
        return float(len(text) % 2)  # some spread, so the advantages are not all 0


def test_replay_matches_the_sampled_distribution_and_trains():
    cfg = load_config(CONFIG, [*SMALL, "actor.replay_sampling_masks=true"])
    with Session(cfg, agent__workflow=SampledAgent()) as s:
        batch = s.rollout()
        tensors = batch.to_tensors()
        masked = tensors.sampling_masked
        spans = [span for row in tensors.sampling_spans for span in row]
        assert masked.any() and {span.masks.constraint is not None for span in spans} == {True, False}
        assert masked.sum() == sum(len(span.positions(10**9)) for span in spans)  # every masked token placed

        actor = s.actor
        step = prepare_step(actor, tensors)
        assert torch.equal(step.engine_logprobs.cpu(), tensors.sampling_logprobs)
        replayed = actor._logprobs_no_grad(actor.model, step).cpu()
        gap = (replayed - tensors.sampling_logprobs).abs()
        assert float(gap[masked].max()) < 1e-4  # grammar, top-k and top-p tokens alike
        assert float(gap[tensors.loss_mask.bool()].max()) < 1e-4  # and the others

        # without replay: the full-vocabulary log-prob of a top-2 token misses the other tokens' mass
        actor.cfg.replay_sampling_masks = False
        full = actor._logprobs_no_grad(actor.model, prepare_step(actor, tensors)).cpu()
        actor.cfg.replay_sampling_masks = True
        top_k_rows = [
            b
            for b, row in enumerate(tensors.sampling_spans)
            if any(
                span.masks.constraint is None
                and all(k is None or len(k) <= 2 for k in span.masks.kept)
                and any(k is not None and len(k) == 2 for k in span.masks.kept)
                for span in row
            )
        ]
        assert top_k_rows
        top_k_gap = (full - tensors.sampling_logprobs).abs()[top_k_rows][masked[top_k_rows]]
        assert float(top_k_gap.mean()) > 1e-3 and float(top_k_gap.mean()) > 100 * float(gap[masked].mean())

        stats = s.train_step(batch)
        assert stats["mismatch_logp_abs_diff"] < 1e-4 and stats["logprob_abs_diff_max"] < 1e-4
        assert torch.isfinite(torch.tensor(stats["loss"]))


def test_replay_refused_with_a_remote_engine():
    with pytest.raises(ConfigError, match="replay_sampling_masks needs engine.type 'local'"):
        load_config(CONFIG, ["actor.replay_sampling_masks=true", "engine.type=sglang"])

"""An agent written against OpenAI's legacy text completions only (`client.completions.create`,
the chat template rendered by the agent itself, as completion-API harnesses do) trains: the proxy
records each call's exact prompt and output ids and log-probs, links a retry that continues its
first try's tokens under it, and the trainer's recomputed log-probs equal the recorded ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_nb import Session
from areal_nb.config import load_config
from areal_nb.data import CORRECTION_PROMPT
from areal_nb.reward import math_reward

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "data.eval_size=4",
    "logging.eval_every=0",
    "logging.progress=false",
]


def chatml(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


class CompletionsMathAgent:
    """Answers, and once corrected answers again, through text completions: the second prompt is
    the first prompt, the reply and the correction, as text."""

    def __init__(self) -> None:
        self.returned: dict[str, tuple[str, list[float]]] = {}  # id → (prompt, the SDK's log-probs)

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        prompt = (
            "".join(chatml(m["role"], m["content"]) for m in data["messages"]) + "<|im_start|>assistant\n"
        )
        rewards = {}
        for _turn in range(2):
            completion = await client.completions.create(model="m", prompt=prompt, logprobs=0)
            choice = completion.choices[0]
            self.returned[completion.id] = (prompt, choice.logprobs.token_logprobs)
            rewards[completion.id] = math_reward(choice.text, data["answer"])
            if rewards[completion.id] == 1.0:
                break
            prompt += (
                choice.text + "<|im_end|>\n" + chatml("user", CORRECTION_PROMPT) + "<|im_start|>assistant\n"
            )
        return rewards


def test_an_agent_of_text_completions_trains_on_what_it_was_served(tiny_tokenizer):
    agent = CompletionsMathAgent()
    with Session(load_config(CONFIG, SMALL), agent__workflow=agent) as s:
        linked = 0
        for step in range(2):
            batch = s.rollout()
            assert not batch.rejected, s.executor.rejection_reasons
            for i in range(len(batch.episodes)):
                calls = batch.calls(i)
                assert 1 <= len(calls) <= 2
                for call in calls:
                    prompt, sdk_logprobs = agent.returned[call.interaction_id]
                    response = call.model_response
                    # no chat template around the agent's text: its own encoding is the prompt
                    assert response.input_tokens == tiny_tokenizer.encode(prompt, add_special_tokens=True)
                    assert sdk_logprobs == response.output_logprobs  # what the agent saw is what trains
                    assert set(response.output_versions) == {step}
                if len(calls) == 2 and calls[1].parent is calls[0]:
                    linked += 1  # the retry's row holds both tries, each trained on its own tokens
                    row, first = calls[1].token_row(), calls[0].model_response
                    kept = first.input_len + len(first.output_tokens_without_stop)
                    assert row.input_ids[:kept] == list(first.input_tokens) + first.output_tokens_without_stop
                    assert row.loss_mask[first.input_len : kept] == [1] * (kept - first.input_len)
                    assert (
                        row.logprobs[first.input_len : kept]
                        == first.output_logprobs[: kept - first.input_len]
                    )
                    n_out = calls[1].model_response.output_len
                    assert row.loss_mask[-n_out:] == [1] * n_out
            stats = s.train_step(batch)
            assert stats["logprob_abs_diff_max"] < 1e-4, stats["logprob_abs_diff_max"]
        assert s.version == 2
        print(f"retries linked under their first try: {linked}")

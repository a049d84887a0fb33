"""The multi-turn math agent loop through `ArealOpenAI` on `LocalEngine` + `tiny-math`.

max_turns 2, the correction prompt, concat template, discount 0.9; the exported leaves' tensors
are checked against the engine's own responses, turn by turn.
"""

from __future__ import annotations

import asyncio

import pytest

from areal_nb.api import InferenceEngine, ModelRequest, ModelResponse
from areal_nb.capture import ArealOpenAI, check_retokenization, concat_padded_tensors
from areal_nb.data import CORRECTION_PROMPT, generate_problems, make_problem
from areal_nb.reward.gsm8k import math_reward
from tests.structured_tools import SAY


class RecordingEngine(InferenceEngine):
    """Passes requests to the real engine and keeps every (request, response) pair."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.max_context = engine.max_context
        self.records: list[tuple[ModelRequest, ModelResponse]] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        resp = await self.engine.agenerate(req)
        self.records.append((req, resp))
        return resp


async def seed_agent_loop(client: ArealOpenAI, data: dict, max_turns: int = 2) -> float:
    messages = list(data["messages"])
    reward = 0.0
    for _ in range(max_turns):
        completion = await client.chat.completions.create(
            messages=messages, temperature=1.0, max_completion_tokens=24
        )
        message = completion.choices[0].message
        messages.append(message)
        reward = math_reward(message.content or "", data["answer"])
        client.set_reward(completion.id, reward)
        if reward == 1:
            break
        messages.append({"role": "user", "content": CORRECTION_PROMPT})
    return reward


def test_multi_turn_math_concat_leaves_match_engine_records(local_engine, tiny_tokenizer):
    problems = generate_problems(2, seed=3)
    # an answer nobody can give forces the second (correction) turn
    problems.append(make_problem(problems[0]["question"], "#### -987654"))
    recorder = RecordingEngine(local_engine)
    clients = [ArealOpenAI(recorder, tiny_tokenizer, chat_template_type="concat") for _ in problems]

    async def episodes():
        return await asyncio.gather(*(seed_agent_loop(c, p) for c, p in zip(clients, problems, strict=True)))

    final_rewards = asyncio.run(episodes())
    assert final_rewards[-1] == 0.0 and len(clients[-1].cache) == 2
    by_response = {id(resp): (req, resp) for req, resp in recorder.records}
    rows = []
    for client, final in zip(clients, final_rewards, strict=True):
        calls = list(client.cache.values())
        raw = [c.reward for c in calls]
        client.apply_reward_discount(turn_discount=0.9)
        leaves = client.export_interactions(style="concat")
        assert len(leaves) == 1 and len(calls) in (1, 2)
        leaf = next(iter(leaves.values()))
        assert leaf is calls[-1] and leaf.parent is (calls[0] if len(calls) == 2 else None)
        if len(calls) == 2:
            assert calls[0].reward == pytest.approx(raw[0] + 0.9 * raw[1])
            assert calls[1].messages[-1] == {"role": "user", "content": CORRECTION_PROMPT}
            assert (
                check_retokenization(calls[1], tiny_tokenizer).prompt_ids
                == calls[1].model_response.input_tokens
            )
        row = leaf.to_tensor_dict()
        ids, mask, lps = (
            row["input_ids"][0].tolist(),
            row["loss_mask"][0].tolist(),
            row["logprobs"][0].tolist(),
        )
        versions, turns = row["versions"][0].tolist(), row["turn_ids"][0].tolist()
        for turn, call in enumerate(calls):
            req, resp = by_response[id(call.model_response)]  # what the engine itself saw and returned
            assert req.input_ids == resp.input_tokens
            start, end = resp.input_len, resp.input_len + resp.output_len
            assert ids[:start] == resp.input_tokens and ids[start:end] == resp.output_tokens
            assert mask[start:end] == [1] * resp.output_len
            assert lps[start:end] == pytest.approx(resp.output_logprobs, abs=1e-6)
            assert versions[start:end] == resp.output_versions
            assert turns[start:end] == [turn] * resp.output_len
        assert len(ids) == end
        assert sum(mask) == sum(c.model_response.output_len for c in calls)
        assert row["rewards"].tolist() == pytest.approx([final])
        rows.append(row)
    batch = concat_padded_tensors(rows)
    assert batch["input_ids"].shape == (len(problems), max(r["input_ids"].shape[1] for r in rows))
    assert all(len(c.cache) >= 1 for c in clients) and len(recorder.records) == sum(
        len(c.cache) for c in clients
    )


def test_areal_openai_takes_choice_regex_and_required_tool_calls(local_engine, tiny_tokenizer):
    """The direct client honours what the proxy's doors do: vLLM's `extra_body` options and
    `tool_choice="required"`, each recorded with the constraint it was sampled under."""
    import json

    client = ArealOpenAI(local_engine, tiny_tokenizer)
    messages = [{"role": "user", "content": "Is 3 + 5 = 8?"}]

    async def calls():
        choice = await client.chat.completions.create(
            messages=messages, max_completion_tokens=20, extra_body={"guided_choice": ["yes", "no"]}
        )
        regex = await client.chat.completions.create(
            messages=messages,
            max_completion_tokens=20,
            extra_body={"structured_outputs": {"regex": "[0-9]{2}"}},
        )
        tool = await client.chat.completions.create(
            messages=messages, max_completion_tokens=60, tools=[SAY], tool_choice="required"
        )
        return choice, regex, tool

    choice, regex, tool = asyncio.run(calls())
    assert choice.choices[0].message.content in ("yes", "no")
    assert len(regex.choices[0].message.content) == 2 and regex.choices[0].message.content.isdigit()
    (call,) = tool.choices[0].message.tool_calls
    assert call.function.name == "say" and json.loads(call.function.arguments)["w"] in ("hi", "bye")
    kinds = [client.cache[c.id].model_response.sampling_masks.constraint.kind for c in (choice, regex, tool)]
    assert kinds == ["choice", "regex", "any_tool_call"]

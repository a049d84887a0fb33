"""Structured output from the SDKs people write agents with trains: the OpenAI Agents SDK with
`output_type=` a pydantic model, and LangChain's `ChatOpenAI.with_structured_output` (its default
`json_schema` method, function calling and JSON mode), each through a Session's proxy on the
built-in tiny model. Every reply is the parsed pydantic object the SDK promised; each call is
recorded with the grammar it was sampled under, and two training steps run with the sampled
distributions replayed (`actor.replay_sampling_masks`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from areal_nb import Session
from areal_nb.config import load_config

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=64",  # a tool call's wrapper alone is ~20 tokens
    "logging.progress=false",
    "actor.replay_sampling_masks=true",
]


class Answer(BaseModel):
    # bounded: tiny-math was never taught JSON, and an unbounded integer can run to max_new_tokens
    answer: int = Field(ge=0, le=999)


def _reward(data: dict[str, Any], parsed: Any) -> float:
    assert isinstance(parsed, Answer), parsed  # the SDK parsed the reply into the promised type
    return float(str(parsed.answer) == str(data["answer"]).strip())


class AgentsSDKAnswer:
    """`Agent(output_type=Answer)` on the Responses model (the Agents SDK's default API)."""

    def __init__(self) -> None:
        self.parsed: list[Answer] = []

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, set_tracing_disabled
        from openai import AsyncOpenAI

        set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        agent = Agent(
            name="math",
            instructions="Answer the question.",
            model=OpenAIResponsesModel(model="m", openai_client=client),
            output_type=Answer,
        )
        question = data["messages"][-1]["content"]
        result = await Runner.run(agent, question, run_config=RunConfig(tracing_disabled=True))
        self.parsed.append(result.final_output)
        return _reward(data, result.final_output)


class LangChainAnswer:
    """`ChatOpenAI(...).with_structured_output(Answer, method=...)`; `None`: LangChain's default."""

    def __init__(self, method: str | None) -> None:
        self.method = method
        self.parsed: list[Answer] = []

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            model="m", base_url=base_url, api_key=api_key, http_async_client=http_client, max_retries=0
        )
        method = {} if self.method is None else {"method": self.method}
        parsed = await llm.with_structured_output(Answer, **method).ainvoke(data["messages"])
        self.parsed.append(parsed)
        return _reward(data, parsed)


@pytest.mark.parametrize(
    ("agent", "kind"),
    [
        (AgentsSDKAnswer(), "json_schema"),
        (LangChainAnswer(None), "json_schema"),  # LangChain's default method sends a json_schema format
        (LangChainAnswer("function_calling"), "tool_call"),  # a tool_choice naming the schema's function
    ],
    ids=["agents-sdk-output-type", "langchain-default", "langchain-function-calling"],
)
def test_structured_output_agent_trains_two_steps(agent, kind):
    with Session(load_config(CONFIG, SMALL), agent__workflow=agent) as s:
        for step in range(2):
            batch = s.rollout()
            assert not batch.rejected, s.executor.rejection_reasons
            calls = [call for i in range(len(batch.episodes)) for call in batch.calls(i)]
            assert calls
            for call in calls:
                masks = call.model_response.sampling_masks
                assert masks is not None and masks.constraint.kind == kind
                assert len(masks.logprobs) == call.model_response.output_len
            tensors = batch.to_tensors().tensors()
            assert tensors["sampling_masked"].any()
            stats = s.train_step(batch)
            # the trainer scores each token under the distribution it was sampled from
            assert stats["mismatch_logp_abs_diff"] < 1e-4, stats
            assert s.version == step + 1
        assert len(agent.parsed) >= 2 * 2 * 2 and all(isinstance(p, Answer) for p in agent.parsed)


class LangChainJSONMode:
    """`with_structured_output(method="json_mode")` without a schema: some JSON object (the
    grammar cannot require keys it was never told about, so tiny-math may well write `{}`)."""

    def __init__(self) -> None:
        self.parsed: list[Any] = []

    async def run(self, data, base_url, api_key, http_client=None, **_):
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            model="m", base_url=base_url, api_key=api_key, http_async_client=http_client, max_retries=0
        )
        # OpenAI's rule for JSON mode: the prompt itself must ask for JSON
        messages = [{"role": "system", "content": 'Reply as JSON: {"answer": <integer>}.'}, *data["messages"]]
        parsed = await llm.with_structured_output(method="json_mode").ainvoke(messages)
        self.parsed.append(parsed)
        return float(isinstance(parsed, dict) and parsed.get("answer") == data["answer"])


def test_langchain_json_mode_gets_json_objects_and_trains():
    agent = LangChainJSONMode()
    with Session(load_config(CONFIG, SMALL), agent__workflow=agent) as s:
        batch = s.rollout()
        assert not batch.rejected, s.executor.rejection_reasons
        call = batch.calls(0)[0]
        assert call.model_response.sampling_masks.constraint.kind == "json_object"
        assert s.train_step(batch)["mismatch_logp_abs_diff"] < 1e-4
    assert agent.parsed and all(isinstance(p, dict) for p in agent.parsed)

"""The built-in agents' shared loop (`areal_nb.agents.sdk_agent`): ask, score, retry with a
prompt until a reply is rewarded or `max_turns` is spent — through the real proxy app in-process
(no socket), the real OpenAI SDK and a scripted model, so each reply is exactly known."""

from __future__ import annotations

from typing import Any

import pytest

from areal_nb.agents.chat_agent import ChatAgent
from areal_nb.agents.math_agent import MultiTurnMathAgent
from areal_nb.agents.sdk_agent import SDKAgent
from areal_nb.data import CORRECTION_PROMPT
from areal_nb.reward import AsyncRewardWrapper, math_reward
from tests import scripted_episode

QUESTION = scripted_episode.QUESTION


def run_episode(tokenizer, agent: Any, replies: list[str], data: dict[str, Any] = QUESTION):
    return scripted_episode.run_episode(tokenizer, agent, replies, data, discount=0.0)


def test_a_wrong_reply_gets_the_retry_prompt_until_one_is_rewarded(tiny_tokenizer):
    agent = ChatAgent(
        reward_fn=lambda row, reply: float(reply == "right"), max_turns=4, retry_prompt="Once more."
    )
    turns, requests = run_episode(tiny_tokenizer, agent, ["wrong", "still wrong", "right", "never asked"])
    prompts = [tiny_tokenizer.decode(r.input_ids) for r in requests]
    assert [t.output_message_list[0]["content"] for t in turns] == ["wrong", "still wrong", "right"]
    assert [t.reward for t in turns] == [0.0, 0.0, 1.0]
    assert turns[1].parent is turns[0] and turns[2].parent is turns[1]  # each retry continues the last
    assert turns[2].messages[-2:] == [
        {"role": "assistant", "content": "still wrong"},
        {"role": "user", "content": "Once more."},
    ]
    assert "Once more." not in prompts[0] and prompts[2].count("Once more.") == 2


def test_max_turns_caps_the_retries(tiny_tokenizer):
    agent = ChatAgent(reward_fn=lambda row, reply: 0.0, max_turns=2)
    turns, _ = run_episode(tiny_tokenizer, agent, ["no", "no", "never asked"])
    assert [t.reward for t in turns] == [0.0, 0.0]


def test_the_math_agent_corrects_once_with_the_seed_prompt(tiny_tokenizer):
    agent = MultiTurnMathAgent()
    try:
        turns, _ = run_episode(tiny_tokenizer, agent, ["The answer is 5.", "The answer is 4.", "never asked"])
    finally:
        agent.close()  # its reward worker processes
    assert [t.reward for t in turns] == [0.0, 1.0]
    assert turns[1].messages[-1] == {"role": "user", "content": CORRECTION_PROMPT}


def test_the_math_agent_sends_a_repeated_reply_to_its_reward_worker_once(tiny_tokenizer):
    class CountingRewards(AsyncRewardWrapper):
        calls = 0

        async def __call__(self, *args: Any, **kwargs: Any) -> float:
            CountingRewards.calls += 1
            return await super().__call__(*args, **kwargs)

    agent = MultiTurnMathAgent()
    try:
        agent._reward = CountingRewards(math_reward)
        first, _ = run_episode(tiny_tokenizer, agent, ["The answer is 5.", "The answer is 5."])
        agent._reward = CountingRewards(math_reward)  # (closing the workflow closed the last one)
        second, _ = run_episode(tiny_tokenizer, agent, ["The answer is 5.", "The answer is 4."])
    finally:
        agent.close()
    assert [t.reward for t in first] == [0.0, 0.0] and [t.reward for t in second] == [0.0, 1.0]
    assert CountingRewards.calls == 2  # "5" once in all, "4" once


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.25, "max_completion_tokens": 3}])
def test_sampling_not_given_is_left_to_the_server(tiny_tokenizer, sampling):
    agent = ChatAgent(reward_fn=lambda row, reply: 1.0, **sampling)
    _, requests = run_episode(tiny_tokenizer, agent, ["ok"])
    gconfig = requests[0].gconfig
    assert gconfig.temperature == sampling.get("temperature", 1.0)  # 1.0: the proxy's default
    if sampling:
        assert gconfig.max_new_tokens == 3


def test_max_turns_must_be_positive():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        SDKAgent(max_turns=0)


def test_the_chat_agent_reads_whichever_of_messages_and_prompt_a_row_fills(tiny_tokenizer):
    from areal_nb.agents.chat_agent import prompt_messages

    user = [{"role": "user", "content": "What is 2 + 2?"}]
    assert prompt_messages({"messages": user, "prompt": None}) == user  # a table's empty cell is None
    assert prompt_messages({"messages": None, "prompt": "What is 2 + 2?"}) == user
    with pytest.raises(KeyError, match=r"neither 'messages' nor 'prompt' \(its keys: \['1', 'prompt'\]\)"):
        prompt_messages({"prompt": None, 1: "x"})  # keys of mixed types are still listed
    with pytest.raises(TypeError, match="'messages' must be a list of chat messages, got str"):
        prompt_messages({"messages": "What is 2 + 2?"})
    agent = ChatAgent(reward_fn=lambda row, reply: reply == "4")
    interactions, requests = run_episode(
        tiny_tokenizer, agent, ["4"], {"messages": None, "prompt": "What is 2 + 2?"}
    )
    assert [i.reward for i in interactions] == [1.0]
    assert tiny_tokenizer.decode(requests[0].input_ids).count("What is 2 + 2?") == 1

"""LLM judges as rewards: parsing, caching, timeouts and group scoring against real loopback servers,
and a judge on the Session's own (frozen) engine that trains 2 steps without its calls being trained on."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI

from areal_nb.reward import Judge, JudgeError, judge
from areal_nb.reward.judge_llm import POINTWISE_SYSTEM, parse_group_scores, parse_score

RUBRIC = "1 if the response states the correct sum, else 0."
ROW = {"prompt": "What is 2 + 3?"}


# ------------------------------------------------------------------ parsing (no server)
def test_scores_are_read_from_the_answer_or_the_answer_is_quoted():
    assert parse_score("The sum is right.\nSCORE: 0.75") == 0.75
    assert parse_score(" 1 ") == 1.0
    assert parse_group_scores("ok\n[1]: 0.2\n[2]: 1\n", 2) == [0.2, 1.0]
    with pytest.raises(JudgeError, match=r"no 'SCORE: <number>': 'looks fine to me'"):
        parse_score("looks fine to me")
    with pytest.raises(JudgeError, match=r"outside \[0, 1\]"):
        parse_score("SCORE: 7")
    with pytest.raises(JudgeError, match=r"no score for response\(s\) \[2\] of 2: '\[1\]: 0.5'"):
        parse_group_scores("[1]: 0.5", 2)


def test_a_judge_says_what_it_needs():
    with pytest.raises(ValueError, match="either base_url"):
        judge(RUBRIC)
    with pytest.raises(ValueError, match="group_size"):
        judge(RUBRIC, base_url="http://127.0.0.1:1/v1", mode="group")
    with pytest.raises(ValueError, match="tokenizer"):
        judge(RUBRIC, engine=object())
    unbound = judge(RUBRIC, engine="initial")
    with pytest.raises(JudgeError, match="was not bound"):
        asyncio.run(unbound(ROW, "5"))


# ------------------------------------------------------------------ loopback judges
class CannedJudge:
    """An OpenAI-compatible chat endpoint on loopback that answers `answer` and counts requests."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[dict] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(body: dict):
            self.requests.append(body)
            return {
                "id": f"c{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": self.answer},
                    }
                ],
            }

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.mark.server
def test_a_pointwise_judge_scores_once_per_trajectory():
    canned = CannedJudge("The response is correct.\nSCORE: 0.9")
    with canned as url:
        score = judge(RUBRIC, base_url=url, model="grader")

        async def go():
            return [await score(ROW, "It is 5."), await score(ROW, "It is 5."), await score(ROW, "It is 6.")]

        assert asyncio.run(go()) == [0.9, 0.9, 0.9]
    assert (
        len(canned.requests) == 2 and score.calls == 2
    )  # the repeated (rubric, trajectory) came from the cache
    prompt = canned.requests[0]["messages"][-1]["content"]
    assert RUBRIC in prompt and ROW["prompt"] in prompt and "It is 5." in prompt
    assert canned.requests[0]["model"] == "grader" and canned.requests[0]["temperature"] == 0.0


@pytest.mark.server
def test_an_unparsable_answer_is_a_reward_error_quoting_it():
    with (
        CannedJudge("I would rather not say.") as url,
        pytest.raises(JudgeError, match=r"no 'SCORE: <number>': 'I would rather not say.'"),
    ):
        asyncio.run(judge(RUBRIC, base_url=url)(ROW, "It is 5."))


@pytest.mark.server
def test_a_hanging_judge_is_bounded_by_its_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_never_answer():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_never_answer, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        with pytest.raises(JudgeError, match=r"did not answer within timeout=0.5s|failed: APITimeoutError"):
            asyncio.run(judge(RUBRIC, base_url=url, timeout=0.5)(ROW, "It is 5."))
        assert accepted  # the request did reach the server, which never answered
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.mark.server
def test_a_group_judge_scores_the_group_in_one_call_relative_to_each_other():
    canned = CannedJudge("[1]: 0.25\n[2]: 1.0")
    with canned as url:
        score = judge(RUBRIC, base_url=url, mode="group", group_size=2)

        async def go():
            first = asyncio.create_task(score(ROW, "It is 6."))
            await asyncio.sleep(0)  # the first reply joins the gathering before the second
            second = asyncio.create_task(score(ROW, "It is 5."))
            return list(await asyncio.gather(first, second))

        assert asyncio.run(go()) == [0.25, 1.0]
    assert len(canned.requests) == 1
    listing = canned.requests[0]["messages"][-1]["content"]
    assert "[1]\nIt is 6." in listing and "[2]\nIt is 5." in listing


@pytest.mark.server
def test_a_group_with_a_missing_member_is_scored_after_group_wait():
    with CannedJudge("[1]: 0.5") as url:
        score = judge(RUBRIC, base_url=url, mode="group", group_size=3, group_wait=0.3)
        assert asyncio.run(score(ROW, "It is 5.")) == 0.5


# ------------------------------------------------------------------ the Session's own engine
def test_a_judge_on_the_initial_policy_needs_an_engine_that_serves_models_in_process(tiny_tokenizer):
    """`engine="initial"` serves a frozen copy of the policy from memory: the Session's engine must
    declare `serves_models_in_process` (server engines load their model from a folder)."""
    from areal_nb.agents.chat_agent import ChatAgent
    from areal_nb.config import ConfigError, load_config
    from areal_nb.session.builder import bind_session_judges
    from areal_nb.testing import ScriptedEngine

    agent = ChatAgent(reward_fn=judge(RUBRIC, engine="initial"))
    servers = ScriptedEngine(tiny_tokenizer, "4")  # (like SGLangEngine: serves no model held here)
    with pytest.raises(ConfigError, match="frozen copy of the policy in an embedded engine"):
        bind_session_judges(load_config(None), agent, None, tiny_tokenizer, servers)
    no_judge = ChatAgent(reward_fn=lambda *args, **kwargs: 1.0)
    assert bind_session_judges(load_config(None), no_judge, None, tiny_tokenizer, servers) is None


@pytest.mark.slow
def test_a_judge_on_the_sessions_frozen_initial_policy_trains_two_steps_and_is_never_trained_on():
    from areal_nb import Session
    from areal_nb.agents.chat_agent import ChatAgent
    from areal_nb.data import generate_problems

    rows = [
        {"prompt": p["question"], "target": p["answer_value"]}
        for p in generate_problems(16, seed=5, split="train")
    ]

    def has_answer_line(answer: str) -> float:  # the tiny model writes GSM8K-style answers, not 'SCORE: x'
        return 1.0 if "####" in answer else 0.0

    grader = judge(RUBRIC, engine="initial", max_tokens=24, parse=has_answer_line)
    agent = ChatAgent(reward_fn=grader)
    with Session(
        dataset=rows,
        agent__workflow=agent,
        rollout__batch_size=2,
        rollout__group_size=2,
        rollout__max_concurrent_rollouts=8,
        rollout__prefetch=False,
        rollout__max_new_tokens=24,
        logging__progress=False,
        model__path="tiny-math",
        model__dtype="float32",
    ) as s:
        assert grader.engine is not None and grader.engine is not s.engine  # an engine of its own
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        assert grader.engine.get_version() == 0  # frozen: the weight pushes went to the policy's engine only
        assert grader.calls > 0
        batch = s.last_batch
        assert batch.accepted and not batch.rejected
        for i, episode in enumerate(batch.episodes):
            calls = batch.calls(i)
            assert len(calls) == 1  # the agent's one call; the judge's call is not in the episode
            assert all(RUBRIC not in str(m.get("content")) for m in calls[0].messages)
            # the reward is the frozen judge's verdict on this reply (greedy: the same answer again)
            reply = calls[0].completion.choices[0].message.content
            task = episode.data["prompt"]
            answer = s._lead.runtime.call(
                grader._generate(
                    [
                        {"role": "system", "content": POINTWISE_SYSTEM},
                        {
                            "role": "user",
                            "content": f"Rubric:\n{RUBRIC}\n\nTask:\n{task}\n\nResponse:\n{reply}",
                        },
                    ]
                )
            )
            assert calls[0].raw_reward == has_answer_line(answer)
        # no exported row carries the judge's prompt
        rows_out = batch.rows()
        assert rows_out and all(RUBRIC not in str(r.interaction.messages) for r in rows_out)
        judge_engine = grader.engine
    assert isinstance(grader, Judge)
    assert judge_engine.closed  # the Session's close closed the judge's engine too


@pytest.mark.slow
@pytest.mark.server
def test_a_group_judge_scores_each_grpo_group_in_one_call_and_trains():
    from areal_nb import Session
    from areal_nb.agents.chat_agent import ChatAgent
    from areal_nb.data import generate_problems

    rows = [{"prompt": p["question"]} for p in generate_problems(16, seed=6, split="train")]
    canned = CannedJudge("[1]: 0.25\n[2]: 1.0")  # the first reply of each group worse than the second
    with canned as url:
        grader = judge(RUBRIC, base_url=url, mode="group", group_size=2, group_wait=2.0)
        with Session(
            dataset=rows,
            agent__workflow=ChatAgent(reward_fn=grader),
            rollout__batch_size=2,
            rollout__group_size=2,
            rollout__max_concurrent_rollouts=8,
            rollout__prefetch=False,
            rollout__max_new_tokens=16,
            logging__progress=False,
            model__path="tiny-math",
            model__dtype="float32",
        ) as s:
            history = s.run(2)
            assert history["step"].tolist() == [1, 2] and s.version == 2
            batch = s.last_batch
            assert batch.accepted and not batch.rejected
            for members in batch.groups.values():
                rewards = sorted(batch.calls(batch.episodes.index(ep))[0].raw_reward for ep in members)
                assert rewards == [0.25, 1.0]  # relative scores from one call, one per member
    # one judge call per group (2 steps x 2 groups) plus the first-episode check scored alone
    listings = [r["messages"][-1]["content"] for r in canned.requests]
    assert len(listings) == 5
    assert sum("[2]\n" in text for text in listings) == 4

"""The classic `verifiers` environments train through the proxy unchanged: a `SingleTurnEnv`, a
`MultiTurnEnv` (the environment answers a wrong first reply) and a `ToolEnv` (a calculator), each
defined here on generated sums and products with a `vf.Rubric`, played by `LegacyVerifiersAgent`.

The classic stack is `verifiers` 0.3.1's (`verifiers.legacy`, 0.4 has none), which needs mcp<2,
so these tests run in their own virtualenv, .venv-verifiers-legacy (`make test-verifiers`, which
`make test` runs, and which fails if the classic stack does not import there); elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys

import httpx
import pytest

from areal_nb import Session
from areal_nb.envs import EnvironmentServerError, LegacyVerifiersAgent, legacy_rows
from tests.envs.replies import last_number, recorded_by_proxy, seen_message

try:
    import verifiers.legacy  # noqa: F401  (the classic stack: 0.3.1 has it, 0.4 does not)
except ImportError:  # .venv, .venv-verifiers; `make test-verifiers` checks the import before it runs these
    pytest.skip(
        "the classic verifiers stack (0.3.1) is not installed: make test-verifiers runs these tests",
        allow_module_level=True,
    )

import verifiers as vf
from datasets import Dataset

pytestmark = pytest.mark.verifiers_legacy

SMALL = {
    "rollout__batch_size": 2,
    "rollout__group_size": 2,
    "rollout__max_concurrent_rollouts": 4,
    "logging__progress": False,
    "rollout__prefetch": False,
    "model__dtype": "float32",
    "rollout__max_new_tokens": 24,
}
RETRY = "That is not right. Try again."
# the rubric's weights: a correct answer scores 1, a reply with a number in it 0.25 more
CORRECT_WEIGHT, NUMBER_WEIGHT = 1.0, 0.25


def sums(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return Dataset.from_list(rows)


def products(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        rows.append({"question": f"What is {a} times {b}?", "answer": str(a * b)})
    return Dataset.from_list(rows)


def sum_rubric() -> vf.Rubric:
    parser = vf.Parser()

    def correct(completion, answer) -> float:
        return float(last_number(parser.parse_answer(completion)) == int(answer))

    def gives_a_number(completion) -> float:
        return float(last_number(parser.parse_answer(completion)) is not None)

    return vf.Rubric(funcs=[correct, gives_a_number], weights=[CORRECT_WEIGHT, NUMBER_WEIGHT], parser=parser)


def rubric_score(last_reply: str, answer: str) -> float:
    """The rubric's score, computed here from the last reply's text alone."""
    number = last_number(last_reply)
    return CORRECT_WEIGHT * float(number == int(answer)) + NUMBER_WEIGHT * float(number is not None)


class RetryEnv(vf.MultiTurnEnv):
    """The environment plays the user: a wrong first reply is told to try again (one more turn)."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=RETRY)]

    @vf.stop
    async def answered_right(self, state) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and last_number(trajectory[-1]["completion"][-1].content) == int(
            state["answer"]
        )


CALCULATOR_PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string"}},
    "required": ["expression"],
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    match = re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", expression)
    if not match:
        return "error: write the product as a*b"
    return str(int(match[1]) * int(match[2]))


def single_turn_env() -> vf.SingleTurnEnv:
    return vf.SingleTurnEnv(dataset=sums(16, 0), eval_dataset=sums(4, 100), rubric=sum_rubric())


def multi_turn_env() -> RetryEnv:
    return RetryEnv(dataset=sums(16, 1), eval_dataset=sums(4, 101), rubric=sum_rubric(), max_turns=2)


def tool_env() -> vf.ToolEnv:
    env = vf.ToolEnv(
        tools=[calculator],
        dataset=products(16, 2),
        eval_dataset=products(4, 102),
        rubric=sum_rubric(),
        max_turns=3,
    )
    # the calculator's schema as tiny-tools was warm-started on (ToolEnv's own, from the
    # signature, adds titles and `strict`, which the tiny model has never seen in its prompt)
    env.tool_defs = [
        vf.Tool(name="calculator", description=calculator.__doc__, parameters=CALCULATOR_PARAMETERS)
    ]
    return env


def recorded_states(env):
    """Every rollout state of the environment (the rubric scores it in place after the rollout)."""
    states = []
    original = env.rollout

    async def recording(input, client, model, sampling_args=None):
        state = await original(input, client, model, sampling_args)
        states.append(state)
        return state

    env.rollout = recording
    return states


def seen_by_env(response) -> tuple[str, list]:
    """A reply the environment's client received: its text and its tool calls (name, arguments)."""
    return seen_message(response.message)


def check_episodes(batch, states):
    """Each proxy episode is one rollout of its row: the replies the environment's client received
    are the recorded tokens, call by call; the episode's reward is the rubric's score of that
    rollout, which is the score of the last recorded reply. Returns the (calls, state) pairs."""
    tok = batch.tokenizer
    pairs = []
    for i, episode in enumerate(batch.episodes):
        calls = sorted(batch.calls(i), key=lambda c: c.created_at)
        recorded = [recorded_by_proxy(tok, c) for c in calls]
        matches = [
            state
            for state in states
            if state["example_id"] == episode.data["example_id"]
            and [seen_by_env(step["response"]) for step in state["trajectory"]] == recorded
        ]
        assert matches, f"no rollout of {episode.data['question']!r} received {recorded}"
        state = matches[0]
        assert state["error"] is None and state["reward"] is not None
        assert batch.episode_return(i) == state["reward"]
        assert state["reward"] == rubric_score(recorded[-1][0], episode.data["answer"])
        assert calls[0].messages == [{"role": "user", "content": episode.data["question"]}]
        pairs.append((calls, state))
    return pairs


def train_two_steps(agent: LegacyVerifiersAgent, model: str):
    states = recorded_states(agent.env)
    rows, held_out = legacy_rows(agent.env), legacy_rows(agent.env, "eval")
    with Session(dataset=rows, eval_dataset=held_out, agent__workflow=agent, model__path=model, **SMALL) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        batch = s.last_batch
        assert batch.accepted and not batch.rejected
        pairs = check_episodes(batch, states)
        # the held-out rows are rollouts of the environment too
        result = s.evaluate()
        assert result.n == len(held_out) and result.rejected == 0
        assert [ep.data for ep in result.batch.episodes] == held_out
        check_episodes(result.batch, states)
    return pairs


def test_rows_are_the_environments_dataset_rows():
    env = single_turn_env()
    rows = legacy_rows(env)
    assert rows == env.get_dataset().to_list() and len(rows) == 16
    first = rows[0]
    assert first["example_id"] == 0 and first["answer"] == sums(1, 0)[0]["answer"]
    assert first["prompt"] == [{"role": "user", "content": first["question"]}]
    assert [r["example_id"] for r in legacy_rows(env, "eval")] == [0, 1, 2, 3]
    assert len(legacy_rows(env, n=5)) == 5
    assert {r["example_id"] for r in legacy_rows(env, n=16, seed=3)} == set(range(16))
    with pytest.raises(ValueError, match="split must be one of"):
        legacy_rows(env, "test")


def test_what_the_agent_takes_and_refuses(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="classic verifiers Environment or an environment id"):
        LegacyVerifiersAgent(object())
    grouped = vf.Rubric(funcs=[lambda completions: [1.0] * len(completions)])
    with pytest.raises(ValueError, match="group reward functions"):
        LegacyVerifiersAgent(vf.SingleTurnEnv(dataset=sums(2, 0), rubric=grouped))
    # an installed environment package, by id: its load_environment(**env_args)
    (tmp_path / "vf_legacy_sums.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "def load_environment(n=2):\n"
        "    rows = [{'question': f'What is {i} + 1?', 'answer': str(i + 1)} for i in range(n)]\n"
        "    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        agent = LegacyVerifiersAgent("vf-legacy-sums", env_args={"n": 3})
        assert isinstance(agent.env, vf.SingleTurnEnv) and len(legacy_rows(agent.env)) == 3
    finally:
        sys.modules.pop("vf_legacy_sums", None)


def scripted_client(replies, requests):
    """An HTTP client that answers every chat completion with the next of `replies` and keeps
    each request body in `requests`."""

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        message = {"role": "assistant", "content": replies[len(requests) - 1]}
        return httpx.Response(
            200,
            json={
                "id": f"c{len(requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            },
        )

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def test_an_episode_is_the_environments_rollout_with_its_sampling_and_its_rubric_score():
    env = RetryEnv(dataset=sums(4, 0), rubric=sum_rubric(), max_turns=2, sampling_args={"temperature": 0.5})
    agent = LegacyVerifiersAgent(env, model="policy", sampling={"max_tokens": 7})
    row = legacy_rows(env)[0]
    requests: list[dict] = []
    wrong = str(int(row["answer"]) + 1)
    http = scripted_client([f"It is {wrong}.", f"It is {row['answer']}."], requests)

    reward = asyncio.run(agent.run(row, base_url="http://proxy.test/v1", api_key="k", http_client=http))
    assert reward == CORRECT_WEIGHT + NUMBER_WEIGHT  # the second reply, as the rubric scores it
    assert not http.is_closed  # the caller's client (the Session's) is left open
    first, second = requests
    # the environment's sampling_args under the agent's, as verifiers sends them
    assert {k: first[k] for k in ("model", "temperature", "max_completion_tokens", "n")} == {
        "model": "policy",
        "temperature": 0.5,
        "max_completion_tokens": 7,
        "n": 1,
    }
    assert first["messages"] == [{"role": "user", "content": row["question"]}]
    sent = [{k: v for k, v in m.items() if v is not None} for m in second["messages"]]
    assert sent[1:] == [
        {"role": "assistant", "content": f"It is {wrong}."},
        {"role": "user", "content": RETRY},
    ]


def test_a_rollout_the_environment_marks_failed_or_that_raises_is_an_error_naming_the_cause():
    env = single_turn_env()
    row = legacy_rows(env)[0]
    agent = LegacyVerifiersAgent(env)
    # nothing listens on port 9: the model call fails, and verifiers records it in the state
    with pytest.raises(
        EnvironmentServerError, match=r"the verifiers rollout failed: ModelError.*APIConnectionError"
    ):
        asyncio.run(agent.run(row, base_url="http://127.0.0.1:9/v1", api_key="k"))

    class Broken(RetryEnv):
        async def env_response(self, messages, state, **kwargs):
            raise RuntimeError("the environment broke")

    broken = LegacyVerifiersAgent(Broken(dataset=sums(2, 0), rubric=sum_rubric(), max_turns=2))
    http = scripted_client(["no idea", "no idea"], [])
    with pytest.raises(
        EnvironmentServerError, match="the verifiers environment raised RuntimeError: the environment broke"
    ):
        asyncio.run(
            broken.run(
                legacy_rows(broken.env)[0], base_url="http://proxy.test/v1", api_key="k", http_client=http
            )
        )
    with pytest.raises(ValueError, match="'prompt' and an 'example_id'"):
        asyncio.run(agent.run({"question": "What is 1 + 1?"}, base_url="http://proxy.test/v1", api_key="k"))


@pytest.mark.slow
def test_a_single_turn_environment_trains_two_steps_with_its_rubric_scores():
    # the agent's sampling reaches the proxy through verifiers (the Session's default is 24 tokens)
    lengths = []
    agent = LegacyVerifiersAgent(single_turn_env(), sampling={"max_tokens": 6})
    for calls, state in train_two_steps(agent, "tiny-math"):
        assert len(calls) == 1 == len(state["trajectory"])
        lengths.append(len(calls[0].model_response.output_tokens))
    assert max(lengths) == 6  # the tiny model's answers are longer: cut at 6


@pytest.mark.slow
def test_a_multi_turn_environment_trains_two_steps_with_its_rubric_scores():
    retried = 0
    for calls, state in train_two_steps(LegacyVerifiersAgent(multi_turn_env()), "tiny-math"):
        assert 1 <= len(calls) == len(state["trajectory"]) <= 2
        if len(calls) == 2:  # the environment's user turn reached the model after the first reply
            first_reply = calls[0].completion.choices[0].message.content
            assert calls[1].messages[-2:] == [
                {"role": "assistant", "content": first_reply},
                {"role": "user", "content": RETRY},
            ]
            retried += 1
    assert retried > 0  # the tiny model rarely sums right: most episodes take the second turn


@pytest.mark.slow
def test_a_tool_environment_trains_two_steps_with_its_rubric_scores():
    with_tools = 0
    for calls, state in train_two_steps(LegacyVerifiersAgent(tool_env()), "tiny-tools"):
        tool_calls = [c for c in calls if c.completion.choices[0].message.tool_calls]
        tool_messages = [m for m in state["completion"] if m.role == "tool"]
        assert len(tool_messages) == sum(len(c.completion.choices[0].message.tool_calls) for c in tool_calls)
        assert state["metrics"]["total_tool_calls"] == len(tool_messages)  # ToolEnv's own metric
        if tool_calls:  # the environment ran the tool and sent its result back in the next call
            (call,) = tool_calls[0].completion.choices[0].message.tool_calls
            result = calculator(**json.loads(call.function.arguments))
            assert tool_messages[0].content == result
            assert calls[1].messages[-1]["role"] == "tool" and calls[1].messages[-1]["content"] == result
            with_tools += 1
    assert with_tools > 0  # tiny-tools is warm-started to call the calculator


@pytest.mark.server  # a proxy on loopback
@pytest.mark.filterwarnings("ignore:.*leaf interaction.*no reward set")
def test_a_conversation_that_outgrows_the_context_is_scored_not_rejected(tiny_tokenizer):
    """The retry turn no longer fits a 40-token context: verifiers' own overlong-prompt check
    recognises the proxy's 400, ends the rollout with the conversation so far, and the rubric
    scores the first reply; the episode is not rejected."""
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine
    from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, start_session

    env = RetryEnv(dataset=sums(8, 0), rubric=sum_rubric(), max_turns=2)
    row = next(r for r in legacy_rows(env) if int(r["answer"]) != 5)  # the scripted reply is wrong
    engine = ScriptedEngine(tiny_tokenizer, "It is 5.")
    engine.max_context = 40  # the first prompt fits, the retry's does not
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    agent = LegacyVerifiersAgent(env, sampling={"max_tokens": 8})
    with ProxyServer(app) as server, httpx.Client(base_url=server.url) as client:
        session_id, key = start_session(client)
        reward = asyncio.run(agent.run(row, base_url=f"{server.url}/v1", api_key=key))
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        exported = client.post(
            "/export_trajectories", headers=admin_headers(), json={"session_id": session_id}
        )
    assert reward == rubric_score("It is 5.", row["answer"]) == NUMBER_WEIGHT
    (recorded,) = exported.json()["interactions"].values()  # the first call only
    assert recorded["messages"] == [{"role": "user", "content": row["question"]}]

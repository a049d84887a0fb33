"""`verifiers` environments train through the proxy unchanged: a single-turn taskset, a multi-turn
environment (the environment plays the user) and a tool-using harness, each defined here
(tests/envs/vf/) against the pinned `verifiers` release and played by `VerifiersAgent`; and an
environment with two seats, of which only one trains (a simulated user played by the same model).

`verifiers` 0.4 needs openai<3, so these tests run in their own virtualenv, .venv-verifiers
(`make test-verifiers`, which `make test` runs, and which fails if `verifiers` does not import
there); elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys

import pydantic
import pytest

from areal_nb import Session
from areal_nb.api import AgentRewards
from areal_nb.envs import EnvironmentServerError, VerifiersAgent, task_rows
from tests.envs.replies import last_number, recorded_by_proxy
from tests.envs.replies import seen_message as seen_by_env

HERE = pathlib.Path(__file__).parent

try:
    import verifiers.v1 as vf
except ImportError:  # .venv (openai 3); `make test-verifiers` checks the import before it runs these
    pytest.skip("verifiers is not installed: make test-verifiers runs these tests", allow_module_level=True)

pytestmark = pytest.mark.verifiers

SMALL = {
    "rollout__batch_size": 2,
    "rollout__group_size": 2,
    "rollout__max_concurrent_rollouts": 4,
    "logging__progress": False,
    "rollout__prefetch": False,
    "model__dtype": "float32",
    "rollout__max_new_tokens": 24,
}


@pytest.fixture(autouse=True)
def environments_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "vf"))
    yield
    for name in [m for m in sys.modules if m.startswith("vf_")]:
        del sys.modules[name]


def recorded_episodes(agent):
    """Every episode `verifiers` returns to the agent, to compare with what the proxy recorded."""
    episodes = []
    original = agent.env.run_episode

    async def recording(task, ctx, **kwargs):
        episode = await original(task, ctx, **kwargs)
        episodes.append(episode)
        return episode

    agent.env.run_episode = recording
    return episodes


def check_episodes(batch, episodes):
    """Each proxy episode is one `verifiers` episode of its row: the replies the environment's client
    received are the recorded tokens, call by call, and the episode's reward is the trace's reward.
    Returns the matched (calls, trace) pairs."""
    tok = batch.tokenizer
    pairs = []
    for i, episode in enumerate(batch.episodes):
        calls = sorted(batch.calls(i), key=lambda c: c.created_at)
        recorded = [recorded_by_proxy(tok, c) for c in calls]
        matches = [
            trace
            for e in episodes
            if e.task.data.model_dump(mode="json", exclude_defaults=True) == episode.data
            for trace in e.traces
            if [seen_by_env(m) for m in trace.assistant_messages] == recorded
        ]
        assert matches, f"no verifiers episode of {episode.data} received {recorded}"
        trace = matches[0]
        assert batch.episode_return(i) == trace.reward
        assert trace.reward == float(last_number(trace.last_reply) == episode.data["answer"])
        assert calls[0].messages[0] == {"role": "user", "content": episode.data["prompt"]}
        pairs.append((calls, trace))
    return pairs


def train_two_steps(agent: VerifiersAgent, model: str, check_eval: bool = False):
    episodes = recorded_episodes(agent)
    rows = task_rows(agent.env.taskset.take(16))
    held_out = task_rows(agent.env.taskset.skip(16).take(4))
    with Session(dataset=rows, eval_dataset=held_out, agent__workflow=agent, model__path=model, **SMALL) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        batch = s.last_batch
        assert batch.accepted and not batch.rejected
        pairs = check_episodes(batch, episodes)
        if check_eval:  # the held-out tasks are environment episodes too
            result = s.evaluate()
            assert result.n == len(held_out) and result.rejected == 0
            assert [ep.data for ep in result.batch.episodes] == held_out
            check_episodes(result.batch, episodes)
    return pairs


USER_PERSONA = "You are the user. Say whether the assistant's answer is right."
USER_MAX_TOKENS = 8


class UserSimConfig(vf.EnvConfig):
    assistant: vf.AgentConfig = vf.AgentConfig(runtime={"type": "subprocess"})
    user: vf.AgentConfig = vf.AgentConfig(
        runtime={"type": "subprocess"}, sampling={"max_tokens": USER_MAX_TOKENS}
    )


class UserSimEnv(vf.Env[UserSimConfig]):
    """The assistant answers the task, a simulated user (the same model, its own seat) answers
    that, and the assistant replies to the user; the user's seat is not trainable."""

    async def setup(self, agents):
        agents.user.trainable = False

    async def run(self, task, agents):
        persona = vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt=USER_PERSONA))
        async with agents.assistant.interaction(task) as assistant, agents.user.interaction(persona) as user:
            answer = await assistant.turn()
            said = await user.turn(answer.last_reply or "(no answer)")
            await assistant.turn(said.last_reply or "(no reply)")


class LateUserSimEnv(UserSimEnv):
    """The same, with the user's seat marked untrainable only once the episode runs."""

    async def setup(self, agents):
        pass

    async def run(self, task, agents):
        agents.user.trainable = False
        await super().run(task, agents)


def user_sim_env(env_type=UserSimEnv, **config):
    # the seed taskset: the single-turn sums (tests/envs/vf/vf_single_turn.py), its harness for both seats
    return env_type(UserSimConfig(taskset={"id": "vf_single_turn"}, **config))


def test_task_rows_are_the_task_data_and_the_agent_rebuilds_the_task():
    agent = VerifiersAgent("vf_single_turn")
    assert isinstance(agent.env, vf.SingleAgentEnv)
    assert agent.env.config.agent.runtime.type == "subprocess"  # loaded by name: the seat runs here
    rows = task_rows(agent.env.taskset.take(3))
    first = next(iter(agent.env.taskset))
    assert rows[0] == {"idx": 0, "prompt": first.data.prompt, "answer": first.data.answer}
    assert [r["idx"] for r in task_rows(agent.env.taskset.skip(20))] == [20, 21, 22, 23]
    task = agent.task(rows[1])
    assert type(task).__name__ == "SumTask" and task.data.answer == rows[1]["answer"]
    with pytest.raises(pydantic.ValidationError):
        agent.task({"prompt": "What is 1 + 1?"})  # the task's data type checks the row
    with pytest.raises(TypeError, match="verifiers.v1.Env or a taskset id"):
        VerifiersAgent(object())


@pytest.mark.server  # the environment's interception server on loopback
def test_an_episode_verifiers_marks_failed_is_an_error_naming_the_cause():
    agent = VerifiersAgent("vf_single_turn")
    rows = task_rows(agent.env.taskset.take(3))

    async def three_at_once():
        # nothing listens on port 9: each harness's model call fails, so each episode does
        runs = [
            agent.run(row, base_url="http://127.0.0.1:9/v1", api_key=f"k{i}") for i, row in enumerate(rows)
        ]
        return await asyncio.gather(*runs, return_exceptions=True)

    errors = asyncio.run(three_at_once())
    for error in errors:
        assert isinstance(error, EnvironmentServerError)
        assert "the verifiers episode failed: ProviderError: All connection attempts failed" in str(error)
    # the concurrent episodes shared one serving of the environment, torn down after the last
    assert agent._holder is None and agent._users == 0
    assert not [k for k in os.environ if k.startswith("AREAL_NB_VERIFIERS_KEY_")]  # no key left behind


@pytest.mark.slow
def test_a_single_turn_taskset_trains_two_steps_with_its_rewards():
    # the agent's sampling reaches the proxy through verifiers (the Session's default is 24 tokens)
    lengths = []
    agent = VerifiersAgent("vf_single_turn", sampling={"max_tokens": 3})
    for calls, trace in train_two_steps(agent, "tiny-math", check_eval=True):
        assert len(calls) == 1 and trace.num_turns == 1
        lengths.append(len(calls[0].model_response.output_tokens))
    assert max(lengths) == 3  # the tiny model's answers are longer: cut at 3


@pytest.mark.slow
def test_a_multi_turn_environment_trains_two_steps_with_its_rewards():
    from vf_multi_turn import RETRY

    retried = 0
    for calls, _trace in train_two_steps(VerifiersAgent("vf_multi_turn"), "tiny-math"):
        assert 1 <= len(calls) <= 2
        if len(calls) == 2:  # the environment's user turn reached the model after the first reply
            first_reply = calls[0].completion.choices[0].message.content
            assert calls[1].messages[-2:] == [
                {"role": "assistant", "content": first_reply},
                {"role": "user", "content": RETRY},
            ]
            retried += 1
    assert retried > 0  # the tiny model rarely sums right: most episodes take the second turn


@pytest.mark.slow
def test_a_tool_using_environment_trains_two_steps_with_its_rewards():
    with_tools = 0
    for calls, trace in train_two_steps(VerifiersAgent("vf_tools"), "tiny-tools"):
        tool_calls = [c for c in calls if c.completion.choices[0].message.tool_calls]
        assert len(trace.tool_messages) == sum(
            len(c.completion.choices[0].message.tool_calls) for c in tool_calls
        )
        if tool_calls:  # the harness ran the tool and sent its result back in the next call
            result = trace.tool_messages[0].content
            assert calls[1].messages[-1]["role"] == "tool" and calls[1].messages[-1]["content"] == result
            with_tools += 1
    assert with_tools > 0  # tiny-tools is warm-started to call the calculator


@pytest.mark.slow
def test_an_untrainable_seat_plays_the_same_model_but_only_the_trainable_seat_is_trained_on():
    agent = VerifiersAgent(user_sim_env())
    episodes = recorded_episodes(agent)
    # the recorded calls of each exported episode are exactly the assistant's, call by call
    # (check_episodes matches them against a trace's replies), and the reward is the assistant's
    pairs = train_two_steps(agent, "tiny-math")
    for calls, trace in pairs:
        assert trace.agent.name == "assistant" and trace.agent.trainable
        assert len(calls) == 2 == trace.num_turns
        (episode,) = [e for e in episodes if any(t is trace for t in e.traces)]
        (user,) = [t for t in episode.traces if t is not trace]
        # the user's seat was answered by the engine, with its own pinned sampling, unrecorded
        assert user.agent.name == "user" and not user.agent.trainable
        assert user.num_turns == 1 and user.calls and not user.calls[0].error
        assert all(0 < call.usage.completion_tokens <= USER_MAX_TOKENS for call in user.calls)
        assert user.agent.config.sampling.model_extra == {"store": False}
        assert trace.agent.config.sampling.model_extra == {}
        # and its reply is what the assistant's second call answered
        first_reply = calls[0].completion.choices[0].message.content
        assert calls[1].messages[-2:] == [
            {"role": "assistant", "content": first_reply},
            {"role": "user", "content": user.last_reply or "(no reply)"},
        ]


SCRIPTED_REPLY = "It is 5."


@pytest.fixture
def scripted_proxy(tiny_tokenizer):
    """A proxy on loopback whose engine always answers `SCRIPTED_REPLY`; yields `play(agent, row)`:
    one episode in a session of its own, returning the agent's result (or the exception it
    raised) and the calls the proxy recorded for training."""
    import httpx

    from areal_nb.proxy import ProxyServer, ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine
    from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, start_session

    engine = ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY)
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with ProxyServer(app) as server, httpx.Client(base_url=server.url) as client:

        def play(agent, row):
            session_id, key = start_session(client)
            try:
                result = asyncio.run(agent.run(row, base_url=f"{server.url}/v1", api_key=key))
            except Exception as exc:
                result = exc
            # the reward the workflow would set (a rejected episode's calls are read, not trained on)
            reward = result if isinstance(result, float) else 0.0
            headers = {"x-api-key": key}
            assert client.post("/rl/set_reward", headers=headers, json={"reward": reward}).status_code == 200
            assert client.post("/rl/end_session", headers=headers).status_code == 200
            exported = client.post(
                "/export_trajectories", headers=admin_headers(), json={"session_id": session_id}
            )
            assert exported.status_code == 200, exported.text
            return result, list(exported.json()["interactions"].values())

        yield play


@pytest.mark.server  # a proxy on loopback and the environment's interception server
@pytest.mark.parametrize("user_harness", [None, "vf_responses"], ids=["chat", "responses"])
def test_an_untrainable_seats_calls_are_answered_but_not_recorded(scripted_proxy, user_harness):
    # `store: false` keeps the user's calls out of the record on the chat and the Responses door
    seats = {}
    if user_harness is not None:
        seats["user"] = vf.AgentConfig(runtime={"type": "subprocess"}, harness={"id": user_harness})
    agent = VerifiersAgent(user_sim_env(**seats), sampling={"max_tokens": 8})
    episodes = recorded_episodes(agent)
    row = task_rows(agent.env.taskset.take(1))[0]
    reward, recorded = scripted_proxy(agent, row)
    (episode,) = episodes
    assistant, user = sorted(episode.traces, key=lambda t: t.agent.name)
    assert [seen_by_env(m) for m in user.assistant_messages] == [(SCRIPTED_REPLY, [])]  # answered
    assert len(assistant.calls) == 2 and len(user.calls) == 1
    # recorded: the assistant's two calls, the second one answering the user's reply
    assert [r["messages"][0] for r in recorded] == [{"role": "user", "content": row["prompt"]}] * 2
    assert recorded[1]["messages"][-1] == {"role": "user", "content": SCRIPTED_REPLY}
    assert reward == assistant.reward == float(last_number(SCRIPTED_REPLY) == row["answer"])


@pytest.mark.server  # a proxy on loopback and the environment's interception server
@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (
            lambda: user_sim_env(LateUserSimEnv),
            "'user' is not trainable but its calls were recorded for training: it was marked "
            "untrainable after Env.setup()",
        ),
    ],
    ids=["marked-after-setup"],
)
# the user's recorded call is a conversation of its own, a leaf the one reward does not reach
@pytest.mark.filterwarnings("ignore:.*leaf interaction.*no reward set")
def test_an_untrainable_seat_the_proxy_would_record_rejects_the_episode(scripted_proxy, env, reason):
    agent = VerifiersAgent(env(), sampling={"max_tokens": 8})
    error, recorded = scripted_proxy(agent, task_rows(agent.env.taskset.take(1))[0])
    assert isinstance(error, EnvironmentServerError) and reason in str(error)
    assert len(recorded) == 3  # the user's call was recorded: the episode must not train


class PlayersConfig(vf.EnvConfig):
    alice: vf.AgentConfig = vf.AgentConfig(runtime={"type": "subprocess"})
    bob: vf.AgentConfig = vf.AgentConfig(runtime={"type": "subprocess"})


class PlayersEnv(vf.Env[PlayersConfig]):
    """Two trainable seats, alice and bob, each answering the task on its own: two agents."""

    async def run(self, task, agents):
        async with agents.alice.interaction(task) as alice, agents.bob.interaction(task) as bob:
            await alice.turn()
            await bob.turn()


def players_env():
    return PlayersEnv(PlayersConfig(taskset={"id": "vf_single_turn"}))


@pytest.mark.server  # a proxy on loopback and the environment's interception server
def test_several_trainable_seats_are_several_agents_each_with_its_own_reward(scripted_proxy):
    agent = VerifiersAgent(players_env(), sampling={"max_tokens": 8})
    episodes = recorded_episodes(agent)
    row = task_rows(agent.env.taskset.take(1))[0]
    result, recorded = scripted_proxy(agent, row)
    (episode,) = episodes
    traces = {t.agent.name: t for t in episode.traces}
    assert set(traces) == {"alice", "bob"} and all(t.agent.trainable for t in traces.values())
    # each seat's calls name the seat: the proxy tags them as two agents
    assert sorted(r["agent"] for r in recorded) == ["alice", "bob"]
    assert result == AgentRewards({"alice": traces["alice"].reward, "bob": traces["bob"].reward})


@pytest.mark.slow
def test_two_seats_train_one_adapter_each():
    agent = VerifiersAgent(players_env())
    episodes = recorded_episodes(agent)
    rows = task_rows(agent.env.taskset.take(16))
    adapters = {"agents": {"alice": {"lora": {"r": 4}}, "bob": {"lora": {"r": 4}}}}
    with Session(dataset=rows, agent__workflow=agent, model__path="tiny-math", **adapters, **SMALL) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and {"reward_mean/alice", "reward_mean/bob"} <= set(history)
        batch = s.last_batch
        assert batch.accepted and not batch.rejected and sorted(batch.agents) == ["alice", "bob"]
        assert (history["logprob_abs_diff_max"] < 1e-4).all()  # each call served by its seat's adapter
        tok = batch.tokenizer
        for i, ep in enumerate(batch.episodes):
            calls = {c.agent: c for c in batch.calls(i)}
            assert set(calls) == {"alice", "bob"}
            # a verifiers episode whose two replies are these calls' recorded tokens (a group's samples
            # may reply alike: the same texts, so the same rewards)
            matches = [
                e
                for e in episodes
                if e.task.data.model_dump(mode="json", exclude_defaults=True) == ep.data
                and all(
                    [seen_by_env(m) for m in t.assistant_messages]
                    == [recorded_by_proxy(tok, calls[t.agent.name])]
                    for t in e.traces
                )
            ]
            assert matches, ep.data
            match = matches[0]
            for trace in match.traces:  # each seat's reward is on its own call, and only there
                assert calls[trace.agent.name].reward == trace.reward


@pytest.fixture
def small_context_proxy(tiny_tokenizer):
    """A proxy on loopback over an engine whose context is 64 tokens; yields its URL."""
    from areal_nb.proxy import ProxyServer, ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine
    from tests.proxy.conftest import PROXY_ADMIN_KEY

    engine = ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY)
    engine.max_context = 64
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    with ProxyServer(app) as server:
        yield server.url


@pytest.mark.server  # a proxy on loopback
@pytest.mark.parametrize("too_long", ["1+" * 100, "7+" * 1000], ids=["tokens", "characters"])
def test_verifiers_recognises_an_overflow_through_every_door(small_context_proxy, too_long):
    """verifiers' own overflow check (its chat program ends the run with the conversation so far
    when it matches) matches what each door answers; other 400s it does not."""
    import anthropic
    import httpx
    import openai
    from verifiers.v1.harnesses.utils.compaction import is_context_overflow

    from tests.proxy.conftest import start_session

    with httpx.Client(base_url=small_context_proxy) as admin:
        _, key = start_session(admin)
    oai = openai.OpenAI(base_url=f"{small_context_proxy}/v1", api_key=key, max_retries=0)
    ant = anthropic.Anthropic(base_url=small_context_proxy, api_key=key, max_retries=0)
    calls = {
        "chat": lambda: oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": too_long}], max_tokens=4
        ),
        "responses": lambda: oai.responses.create(model="m", input=too_long, max_output_tokens=4),
        "messages": lambda: ant.messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": too_long}]
        ),
    }
    for door, call in calls.items():
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as caught:
            call()
        assert is_context_overflow(caught.value), (door, caught.value)
    with pytest.raises(openai.BadRequestError) as caught:  # not an overflow
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, frequency_penalty=1
        )
    assert not is_context_overflow(caught.value)


@pytest.mark.server  # a proxy on loopback
def test_verifiers_reads_the_context_window_from_the_model_card(small_context_proxy):
    """verifiers compacts a conversation before it overflows when the model card says how large
    the context is (its `discover_threshold`)."""
    import openai
    from verifiers.v1.harnesses.utils.compaction import default_threshold, discover_threshold

    async def threshold():
        async with openai.AsyncOpenAI(base_url=f"{small_context_proxy}/v1", api_key="none") as client:
            return await discover_threshold(client, "areal-nb")

    assert asyncio.run(threshold()) == default_threshold(64)


@pytest.mark.server  # a proxy on loopback and the environment's interception server
@pytest.mark.filterwarnings("ignore:.*leaf interaction.*no reward set")
def test_a_conversation_that_outgrows_the_context_is_scored_not_rejected(tiny_tokenizer):
    """The second turn of the multi-turn environment no longer fits a 40-token context: the
    harness sees an overflow by verifiers' own check and ends the run with the conversation so
    far, and the episode is scored on it (the first reply) instead of rejected."""
    import httpx

    from areal_nb.proxy import ProxyServer, ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine
    from tests.proxy.conftest import PROXY_ADMIN_KEY, admin_headers, start_session

    engine = ScriptedEngine(tiny_tokenizer, SCRIPTED_REPLY)
    engine.max_context = 40  # the first prompt is 22 tokens, the second (with the retry) 65
    app = create_app(engine, tiny_tokenizer, ProxySettings(admin_api_key=PROXY_ADMIN_KEY))
    agent = VerifiersAgent("vf_multi_turn", sampling={"max_tokens": 8})
    episodes = recorded_episodes(agent)
    # a task the scripted reply gets wrong, so the environment asks again
    row = next(r for r in task_rows(agent.env.taskset.take(24)) if r["answer"] != 5)
    with ProxyServer(app) as server, httpx.Client(base_url=server.url) as client:
        session_id, key = start_session(client)
        reward = asyncio.run(agent.run(row, base_url=f"{server.url}/v1", api_key=key))
        assert client.post("/rl/end_session", headers={"x-api-key": key}).status_code == 200
        exported = client.post(
            "/export_trajectories", headers=admin_headers(), json={"session_id": session_id}
        )
    assert reward == 0.0  # scored: "It is 5." is not the answer
    (episode,) = episodes
    (trace,) = episode.traces
    assert trace.reward == 0.0 and trace.last_reply == SCRIPTED_REPLY
    assert [c.error is not None for c in trace.calls] == [False, True]  # the overflow stays on its call
    (recorded,) = exported.json()["interactions"].values()  # the first call only
    assert recorded["messages"] == [{"role": "user", "content": row["prompt"]}]

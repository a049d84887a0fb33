"""OpenEnv environments train through the proxy: a text environment served on loopback by OpenEnv's
own `create_app` (tests/envs/text_env_app.py), played over its WebSocket session by `OpenEnvAgent`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib
import random

import pytest

from areal_nb import Session
from areal_nb.envs import EnvironmentServerError, OpenEnvAgent, OpenEnvServer

# (found, not imported: the server side pulls in gradio, which only the slow tests' server needs)
if importlib.util.find_spec("openenv") is None:
    pytest.skip("openenv is not installed", allow_module_level=True)

HERE = pathlib.Path(__file__).parent
rng = random.Random(3)
ROWS = [{"a": rng.randint(1, 9), "b": rng.randint(1, 9), "id": i} for i in range(16)]
HELD_OUT = [{"a": rng.randint(1, 9), "b": rng.randint(1, 9), "id": 100 + i} for i in range(4)]
SMALL = {
    "rollout__batch_size": 2,
    "rollout__group_size": 2,
    "rollout__max_concurrent_rollouts": 8,
    "logging__progress": False,
    "rollout__prefetch": False,
    "model__path": "tiny-math",
    "model__dtype": "float32",
    "rollout__max_new_tokens": 24,
}


def text_env() -> OpenEnvServer:
    return OpenEnvServer("text_env_app:app", cwd=HERE)


def env_module():
    spec = importlib.util.spec_from_file_location("text_env_app", HERE / "text_env_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_unreachable_server_is_a_clear_error_before_any_model_call():
    agent = OpenEnvAgent("http://127.0.0.1:9", message_timeout=5)  # port 9 (discard): nothing listens
    with pytest.raises(
        EnvironmentServerError, match=r"cannot reach the OpenEnv server at ws://127\.0\.0\.1:9/ws"
    ):
        asyncio.run(agent.run({"a": 1, "b": 2}, base_url="http://127.0.0.1:9/v1", api_key="k"))


def test_a_server_that_is_not_started_says_so():
    server = text_env()
    with pytest.raises(EnvironmentServerError, match="not started; call start"):
        server.running_url()
    with pytest.raises(ValueError, match="import path"):
        OpenEnvServer("text_env_app")


@pytest.mark.slow
def test_an_openenv_text_environment_trains_two_steps_with_its_rewards():
    env = env_module()
    server = text_env()
    agent = OpenEnvAgent(server, max_turns=2)
    with Session(dataset=ROWS, eval_dataset=HELD_OUT, agent__workflow=agent, **SMALL) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        batch = s.last_batch
        assert batch.accepted and not batch.rejected
        tok = batch.tokenizer
        quoted = 0
        for i, episode in enumerate(batch.episodes):
            answer = episode.data["a"] + episode.data["b"]
            calls = sorted(batch.calls(i), key=lambda c: c.created_at)
            assert 1 <= len(calls) <= env.MAX_TRIES
            for turn, call in enumerate(calls):
                # what the environment's client received is the text of the tokens the proxy recorded
                reply = call.completion.choices[0].message.content
                recorded = tok.decode(call.model_response.output_tokens, skip_special_tokens=True)
                assert recorded.strip() == reply.strip()
                # and the reward on that call is the environment's score of that text
                assert call.raw_reward == env.score(reply, answer)
                if turn + 1 < len(calls):  # the environment quoted the reply back in the next observation
                    observation = calls[turn + 1].messages[-1]["content"]
                    assert observation == f"{env.QUOTE}{reply}\nThat is not right. Try again."
                    quoted += 1
            assert batch.episode_return(i) == sum(c.raw_reward for c in calls)
        assert quoted > 0  # the tiny model rarely answers right in 24 tokens: most episodes take both tries
        # the first observation is the environment's reset for the row
        first = min(batch.calls(0), key=lambda c: c.created_at)
        row = batch.episodes[0].data
        assert first.messages[-1]["content"] == f"What is {row['a']} + {row['b']}? Answer with the number."
        # the held-out rows are environment episodes too, played greedily
        result = s.evaluate()
        assert result.n == len(HELD_OUT) and result.rejected == 0
        assert [ep.data for ep in result.batch.episodes] == HELD_OUT
        assert result.reward_mean == sum(result.batch.episode_return(i) for i in range(len(HELD_OUT))) / len(
            HELD_OUT
        )
        process = server.process
        assert process is not None and process.poll() is None
    assert server.process is None and process.poll() is not None  # the Session's close stopped the server


@pytest.mark.slow
def test_a_dead_environment_server_rejects_episodes_with_a_clear_message_and_the_run_goes_on():
    server = text_env()
    agent = OpenEnvAgent(server, max_turns=1)
    with Session(dataset=ROWS, agent__workflow=agent, **SMALL) as s:
        s.run(1)
        dead_url = server.url
        server.process.kill()
        server.process.wait()
        batch = s.rollout()
        assert batch.episodes and not batch.accepted
        for episode in batch.rejected:
            assert "OpenEnv server 'text_env_app:app'" in episode.rejection_reason
            assert f"at {dead_url} is not running" in episode.rejection_reason
        server.start()  # back up (a new port): the next episodes reach it
        history = s.run(1)
        assert s.version == 2 and history["step"].tolist()[-1] == 2
        assert s.last_batch.accepted and not s.last_batch.rejected

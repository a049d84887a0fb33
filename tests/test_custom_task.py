"""Bring your own task: rows in any common form + a reward function, trained and evaluated end to end.

The task: GSM8K-style word problems as `{"prompt", "target"}` rows (not the math task's shape),
scored by a plain function defined here. Real Session: tiny model, embedded engine, real proxy.
"""

from __future__ import annotations

import re
import threading

import pandas as pd
import pytest

from areal_nb import Session
from areal_nb.agents.chat_agent import ChatAgent
from areal_nb.data import DatasetError, generate_problems, write_jsonl
from areal_nb.models.evaluation import generate_replies
from areal_nb.session.preflight import FirstEpisodeError
from areal_nb.session.rejections import MAX_EMPTY_BATCHES, RolloutRejectedError

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": p["question"], "target": p["answer_value"], "id": i}
    for i, p in enumerate(generate_problems(24, seed=7, split="train"))
]
HELD_OUT = [
    {"prompt": p["question"], "target": p["answer_value"], "id": 100 + i}
    for i, p in enumerate(generate_problems(12, seed=8, split="test"))
]
SMALL = dict(
    rollout__batch_size=2,
    rollout__group_size=2,
    rollout__max_concurrent_rollouts=8,
    logging__progress=False,
    rollout__prefetch=False,
    model__path="tiny-math",
    model__dtype="float32",
)


def target_in_reply(row, reply):
    return 1.0 if row["target"] in reply else 0.0


class RecordingAgent(ChatAgent):
    """ChatAgent that also keeps every row it was given (to check rows arrive unchanged)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[dict] = []
        self._lock = threading.Lock()

    async def run(self, data, **kw):
        with self._lock:
            self.seen.append(data)
        return await super().run(data, **kw)


def as_source(form: str, tmp_path):
    if form == "list":
        return list(ROWS)
    if form == "dataframe":
        return pd.DataFrame(ROWS)
    if form == "jsonl":
        return str(write_jsonl(ROWS, tmp_path / "task.jsonl"))
    if form == "parquet":
        path = tmp_path / "task.parquet"
        pd.DataFrame(ROWS).to_parquet(path)
        return str(path)
    import datasets

    return datasets.Dataset.from_list(ROWS)


@pytest.mark.parametrize("form", ["list", "dataframe", "jsonl", "parquet", "datasets"])
def test_the_same_task_trains_from_every_form(form, tmp_path):
    agent = RecordingAgent(reward_fn=target_in_reply)
    with Session(
        dataset=as_source(form, tmp_path), eval_dataset=HELD_OUT, agent__workflow=agent, **SMALL
    ) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and s.version == 2
        assert s.last_batch is not None and not s.last_batch.rejected
        # every row the agent saw is one of the dataset's rows, exactly (the probe's row 0 first)
        assert agent.seen[0] == ROWS[0]
        assert all(row in ROWS for row in agent.seen)
        assert s.data.pos == 4  # 2 steps x 2 prompts
        assert s.eval_problems == HELD_OUT


def test_the_stream_order_is_seeded_and_the_same_for_every_form(tmp_path):
    def first_rows(source):
        with Session(
            dataset=source, agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL, start=False
        ) as s:
            s.start()
            return [next(s.data)["id"] for _ in range(30)]  # past one pass over the 24 rows

    ids = first_rows(list(ROWS))
    assert first_rows(pd.DataFrame(ROWS)) == ids
    assert sorted(ids[:24]) == list(range(24))  # each pass is a permutation of the rows
    assert ids[:24] != list(range(24))  # shuffled


def test_evaluate_is_the_mean_reward_of_greedy_episodes_and_pass_at_k():
    with Session(
        dataset=ROWS, eval_dataset=HELD_OUT, agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL
    ) as s:
        result = s.evaluate(pass_k=3)
        replies = generate_replies(
            s.actor.model, s.tokenizer, [[{"role": "user", "content": r["prompt"]}] for r in HELD_OUT]
        )
        expected = [target_in_reply(row, reply) for row, reply in zip(HELD_OUT, replies, strict=True)]
        assert (result.n, result.rejected, result.version) == (12, 0, 0)
        assert result.reward_mean == sum(expected) / len(expected)
        assert 0 < result.reward_mean < 1  # the tiny model solves some, not all: the figure can move
        # pass@3: 3 sampled episodes per problem; solved problems are those with a rewarded episode
        samples = result.samples
        assert result.k == 3 and len(samples.episodes) == 36
        solved = {samples.episodes[i].data["id"] for i in range(36) if samples.episode_return(i) > 0}
        assert result.pass_at_k == len(solved) / 12
        assert result.as_dict()["eval_pass@3"] == result.pass_at_k
        # the sampled policy's accuracy: the share of the 36 episodes rewarded (one call each)
        rewarded = sum(samples.episode_return(i) > 0 for i in range(36))
        assert result.sampled_accuracy == rewarded / 36
        assert result.as_dict()["eval_sampled_accuracy"] == result.sampled_accuracy
        assert s.version == 0 and s.data.pos == 0  # evaluation trains on nothing
        with pytest.raises(ValueError, match="pass_k must be an int >= 1"):
            s.evaluate(pass_k=0)


def test_a_held_out_fraction_splits_the_rows_when_no_eval_split_is_given():
    agent = ChatAgent(reward_fn=target_in_reply)
    with Session(dataset=ROWS, data__eval_fraction=0.25, agent__workflow=agent, **SMALL) as s:
        ids = {r["id"] for r in s.eval_problems}
        assert len(ids) == 6 and not ids & {r["id"] for r in s.data.rows}
        assert s.evaluate().n == 6
    with Session(dataset=ROWS, agent__workflow=agent, **SMALL) as s:
        with pytest.raises(ValueError, match="no held-out rows; pass eval_dataset"):
            s.evaluate()


def test_save_stores_python_rows_and_load_continues_the_stream(tmp_path):
    rows = [{**r, "answer": r["target"]} for r in ROWS]
    cfg = dict(
        SMALL,
        agent__workflow="areal_nb.agents.chat_agent.ChatAgent",
        agent__workflow_kwargs={"reward_fn": "areal_nb.reward.functions.math_answer"},
    )
    with Session(dataset=rows, eval_dataset=pd.DataFrame(rows[:4]), **cfg) as s:
        s.run(1)
        path = s.save(tmp_path / "ckpt")
        upcoming = [next(s.data)["id"] for _ in range(5)]
    assert (path / "data" / "train.jsonl").is_file() and (path / "data" / "eval.jsonl").is_file()
    text = (path / "config.yaml").read_text()
    assert "train.jsonl" in text and "What is" not in text  # a path, not the rows
    with Session.load(path, logging__progress=False) as restored:
        assert restored.data.rows == rows and restored.eval_problems == rows[:4]
        assert restored.config.data.format == "rows"  # read back as rows even with an "answer" key
        assert [next(restored.data)["id"] for _ in range(5)] == upcoming


# ----------------------------------------------------------------------------- bad data fails early


def test_an_empty_dataset_fails_in_the_constructor():
    with pytest.raises(DatasetError, match="data.source is empty"):
        Session(dataset=[], agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL)


def test_a_row_that_is_not_a_mapping_is_named():
    with pytest.raises(DatasetError, match="data.source row 2 is a list, not a mapping"):
        Session(
            dataset=[ROWS[0], ROWS[1], ["oops"]],
            agent__workflow=ChatAgent(reward_fn=target_in_reply),
            **SMALL,
        )
    with pytest.raises(DatasetError, match="data.eval_source row 0 is a str"):
        Session(
            dataset=ROWS, eval_dataset=["x"], agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL
        )


def test_unpicklable_rows_fail_for_subproc_agents():
    rows = [{**ROWS[0], "lock": threading.Lock()}, *ROWS[1:]]  # no pickler sends a lock
    with pytest.raises(DatasetError, match=r"row 0 cannot be pickled .*mode 'subproc'"):
        Session(
            dataset=rows,
            agent__workflow="areal_nb.agents.chat_agent.ChatAgent",
            agent__workflow_kwargs={"reward_fn": "areal_nb.reward.functions.math_answer"},
            agent__mode="subproc",
            **SMALL,
        )


def test_a_missing_key_fails_the_first_rollout_with_the_row_the_key_and_the_traceback():
    rows = [{"prompt": r["prompt"], "answer": r["target"]} for r in ROWS]  # "target" is what the reward reads
    agent = RecordingAgent(reward_fn=target_in_reply)
    with Session(dataset=rows, agent__workflow=agent, **SMALL) as s:
        with pytest.raises(FirstEpisodeError) as info:
            s.run(1)
        message = str(info.value)
        assert "training row 0" in message and "KeyError: 'target'" in message
        assert "row 0 has keys ['answer', 'prompt']" in message
        assert "The agent's traceback:" in message and "in target_in_reply" in message
        assert len(agent.seen) == 1  # one episode, not a batch of rejections
        assert s.step_count == 0 and s.data.pos == 0
        with pytest.raises(FirstEpisodeError):  # rollout() checks too, until a first episode succeeds
            s.rollout()


def test_a_reward_that_raises_is_reported_with_its_traceback():
    def strict_reward(row, reply):
        raise ValueError(f"cannot score {reply!r}")

    with Session(dataset=ROWS, agent__workflow=ChatAgent(reward_fn=strict_reward), **SMALL) as s:
        with pytest.raises(FirstEpisodeError, match=r"(?s)ValueError: cannot score.*in strict_reward"):
            s.rollout()


# ----------------------------------------------------------------------------- what people write


def test_a_dataframe_mixing_prompt_and_messages_rows_and_a_bool_reward_trains():
    # pd.DataFrame of rows with different keys: each row has an empty cell (None) where the other
    # kind has its prompt; the reward returns a bool, as `target in reply` does
    rows = [
        {"prompt": r["prompt"], "target": r["target"]}
        if i % 2
        else {"messages": [{"role": "user", "content": r["prompt"]}], "target": r["target"]}
        for i, r in enumerate(ROWS)
    ]
    agent = RecordingAgent(reward_fn=lambda row, reply: row["target"] in reply)
    with Session(dataset=pd.DataFrame(rows), agent__workflow=agent, **SMALL) as s:
        history = s.run(2)
        assert history["step"].tolist() == [1, 2] and not s.last_batch.rejected
        batch = s.last_batch
        calls = [c for i in range(len(batch.episodes)) for c in batch.calls(i)]
        assert {c.raw_reward for c in calls} <= {0.0, 1.0}  # True / False as 1.0 / 0.0
        assert {tuple(sorted(row)) for row in agent.seen} == {("messages", "prompt", "target")}
        assert all((row["prompt"] is None) != (row["messages"] is None) for row in agent.seen)
        # each row's own question reached the model, whichever column held it
        assert {c.messages[0]["content"] for c in calls} <= {r["prompt"] for r in ROWS}


# ----------------------------------------------------------------------------- bad rows later on


def rows_missing_target(bad: set[int]) -> list[dict]:
    return [{k: v for k, v in r.items() if not (k == "target" and i in bad)} for i, r in enumerate(ROWS)]


def test_rows_missing_a_key_reject_only_their_episodes_named_by_row_and_training_goes_on():
    bad = {i for i in range(1, 24) if i % 3 == 1}  # row 0 is good: the first-episode check passes
    with Session(
        dataset=rows_missing_target(bad), agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL
    ) as s:
        history = s.run(4)
        assert history["step"].tolist() == [1, 2, 3, 4] and s.version == 4
        reasons = s.executor.rejection_reasons
        assert reasons, "the seeded stream drew no bad row in 4 steps"
        for reason in reasons:
            match = re.fullmatch(
                r"data\.source row (\d+): agent_error: agent raised KeyError: 'target'", reason
            )
            assert match and int(match.group(1)) in bad, reason


def test_when_every_batch_is_rejected_the_run_stops_with_the_reasons_and_rows():
    calls = []

    def only_the_check_scores(row, reply):  # the first-episode check passes, every episode after fails
        calls.append(row["id"])
        if len(calls) > 1:
            raise ValueError("no scorer for this row")
        return 1.0

    agent = RecordingAgent(reward_fn=only_the_check_scores)
    with Session(dataset=ROWS, agent__workflow=agent, **SMALL) as s:
        with pytest.raises(RolloutRejectedError) as info:
            s.run(1)
        message = str(info.value)
        assert f"every episode of the last {MAX_EMPTY_BATCHES} rollout batch(es) was rejected" in message
        assert (
            f"{4 * MAX_EMPTY_BATCHES}× agent_error: agent raised ValueError: no scorer for this row — "
            "data.source rows " in message
        )
        named = {int(i) for i in re.search(r"data\.source rows ([\d, ]+)", message).group(1).split(", ")}
        assert named == {row["id"] for row in agent.seen[1:]}  # every row that ran, after the check's
        assert len(agent.seen) == 1 + 4 * MAX_EMPTY_BATCHES and s.step_count == 0 and s.version == 0
        # calling train_step on such a batch says why there is nothing to train on
        with pytest.raises(
            ValueError,
            match=r"no accepted episodes to train on: its 4 episode\(s\) were rejected "
            r"\(agent_error: agent raised ValueError: no scorer for this row\)",
        ):
            s.train_step(s.rollout())


def test_a_held_out_row_that_fails_is_named_in_evaluation(caplog):
    held_out = [dict(HELD_OUT[0]), {"prompt": HELD_OUT[1]["prompt"]}, dict(HELD_OUT[2])]
    with Session(
        dataset=ROWS, eval_dataset=held_out, agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL
    ) as s:
        result = s.evaluate()
        assert (result.n, result.rejected) == (3, 1)
        assert [str(ep.data) for ep in result.batch.rejected] == [str(held_out[1])]
        rejected = [r.getMessage() for r in caplog.records if "episode rejected" in r.getMessage()]
        assert [m.split("): ", 1)[1] for m in rejected] == [
            "held-out row 1: agent_error: agent raised KeyError: 'target'"
        ]


def test_evaluate_takes_problems_in_any_dataset_form_and_checks_them(tmp_path):
    with Session(dataset=ROWS, agent__workflow=ChatAgent(reward_fn=target_in_reply), **SMALL) as s:
        as_list = s.evaluate(problems=HELD_OUT[:4])
        as_frame = s.evaluate(problems=pd.DataFrame(HELD_OUT[:4]))  # list(df) would be its column names
        as_file = s.evaluate(problems=str(write_jsonl(HELD_OUT[:4], tmp_path / "held_out.jsonl")))
        assert as_frame.n == as_file.n == 4 and as_frame.rejected == as_file.rejected == 0
        assert as_frame.reward_mean == as_file.reward_mean == as_list.reward_mean
        with pytest.raises(DatasetError, match="problems row 1 is a str, not a mapping"):
            s.evaluate(problems=[HELD_OUT[0], "What is 2 + 2?"])
        with pytest.raises(ValueError, match="needs at least one problem"):
            s.evaluate(problems=[])


class ChangesItsData(ChatAgent):
    async def run(self, data, **kw):
        data["prompt"] += " Think step by step."  # agents may change their `data`: it is their copy
        return await super().run(data, **kw)


def test_an_agent_changing_its_data_leaves_the_dataset_as_it_was():
    rows = [dict(r) for r in ROWS]
    with Session(dataset=rows, agent__workflow=ChangesItsData(reward_fn=target_in_reply), **SMALL) as s:
        s.run(1)
        s.evaluate(problems=rows[:2])
    assert rows == ROWS  # the first-episode check's row 0 included

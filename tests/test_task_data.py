"""What `data.source` resolves to (no model, no Session): generated, GSM8K or the user's rows."""

from __future__ import annotations

import json

import pytest

from areal_nb.config import ConfigError, DataConfig
from areal_nb.data import DatasetError, generate_problems
from areal_nb.session.data import DataStream, load_task_data

ROWS = [{"question": f"q{i}", "answer": f"{i}", "id": i} for i in range(10)]


def test_generated_source_streams_fresh_problems_and_holds_out_the_test_split():
    data = load_task_data(DataConfig(eval_size=5))
    assert data.train is None
    assert data.held_out == generate_problems(5, seed=0, split="test")


def test_a_jsonl_with_question_and_answer_is_read_as_gsm8k_unless_format_rows(tmp_path):
    path = tmp_path / "gsm8k_train.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"Tom has {i} pens.", "answer": f"{i}\n#### {i}"}) + "\n"
            for i in range(40)
        )
    )
    gsm8k = load_task_data(DataConfig(source=str(path)))
    assert "messages" in gsm8k.train[0] and gsm8k.train[0]["answer_value"]  # converted to chat prompts
    rows = load_task_data(DataConfig(source=str(path), format="rows", eval_fraction=0.1))
    assert set(rows.train[0]) == {"question", "answer"} and len(rows.held_out) == 4  # unchanged


def test_a_row_source_is_checked_and_split_by_the_held_out_fraction():
    data = load_task_data(DataConfig(source=ROWS, eval_fraction=0.3, seed=2))
    assert len(data.train) == 7 and len(data.held_out) == 3
    assert sorted(r["id"] for r in data.train + data.held_out) == list(range(10))
    assert load_task_data(DataConfig(source=ROWS, eval_fraction=0.3, seed=2)) == data
    assert load_task_data(DataConfig(source=ROWS)).held_out == []  # evaluate() then asks for one
    assert load_task_data(DataConfig(source=ROWS, eval_source=ROWS[:2], eval_size=1)).held_out == ROWS[:1]
    with pytest.raises(DatasetError, match="data.source is empty"):
        load_task_data(DataConfig(source=[]))


def test_contradictory_held_out_settings_are_config_errors():
    with pytest.raises(ConfigError, match="not both"):
        load_task_data(DataConfig(source=ROWS, eval_source=ROWS, eval_fraction=0.2))
    with pytest.raises(ConfigError, match="has its own test split"):
        load_task_data(DataConfig(eval_fraction=0.2))


def test_the_stream_resumes_at_a_saved_position():
    stream = DataStream(DataConfig(source=ROWS), rows=ROWS)
    first = [next(stream)["id"] for _ in range(25)]  # two and a half passes
    resumed = DataStream(DataConfig(source=ROWS), rows=ROWS).at(12)
    assert [next(resumed)["id"] for _ in range(13)] == first[12:]
    assert stream.first_row() is ROWS[0]


def test_a_jsonl_of_a_users_own_question_answer_rows_is_read_as_rows(tmp_path):
    # GSM8K answers end in "#### <value>"; a task of one's own may call its fields question/answer too
    path = tmp_path / "capitals.jsonl"
    rows = [{"question": f"Capital of country {i}?", "answer": f"City {i}"} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_task_data(DataConfig(source=str(path))).train == rows


def test_a_file_of_an_unknown_kind_is_refused_naming_the_kinds_read(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("What is 2 + 3?\n")
    with pytest.raises(DatasetError, match=r"rows.txt' is not a .jsonl/.json/.parquet/.csv/.tsv file"):
        load_task_data(DataConfig(source=str(path)))
    with pytest.raises(DatasetError, match=r"data.eval_source: .*rows.txt' is not a"):
        load_task_data(DataConfig(source=ROWS, eval_source=str(path)))


def test_the_stream_names_each_row_by_its_place_in_the_source_after_a_split():
    data = load_task_data(DataConfig(source=ROWS, eval_fraction=0.3, seed=2))
    assert data.train_index == [r["id"] for r in data.train] != list(range(7))
    stream = DataStream(DataConfig(source=ROWS), rows=data.train, index=data.train_index)
    for row in [next(stream) for _ in range(10)] + [next(stream.at(3))]:
        assert stream.describe(row) == f"data.source row {row['id']}"
    assert stream.describe(dict(ROWS[0])) is None  # a copy is not one of the stream's rows
    assert DataStream(DataConfig()).describe(generate_problems(1)[0]) is None  # generated: no dataset row


def test_your_own_held_out_rows_are_all_evaluated_unless_eval_size_cuts_them():
    many = [{"prompt": f"q{i}", "id": i} for i in range(250)]
    assert load_task_data(DataConfig(source=ROWS, eval_source=many)).held_out == many  # not the first 200
    assert len(load_task_data(DataConfig(source=many, eval_fraction=0.9)).held_out) == 225
    assert load_task_data(DataConfig(source=ROWS, eval_source=many, eval_size=7)).held_out == many[:7]
    assert len(load_task_data(DataConfig()).held_out) == 200  # the generated test split: 200 by default

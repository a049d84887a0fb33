"""A user's rows in every accepted form come back unchanged; bad datasets fail with the row and why."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from areal_nb.data import DatasetError, check_rows, load_rows, read_row_file, split_rows, write_jsonl

ROWS = [
    {"prompt": "What is 2 + 3?", "target": "5", "difficulty": 1},
    {"prompt": "What is 7 - 4?", "target": "3", "difficulty": 2},
    {"prompt": "What is 6 + 1?", "target": "7", "difficulty": 1},
]


def test_a_list_of_dicts_is_copied_not_changed():
    rows = load_rows(ROWS)
    assert rows == ROWS and rows is not ROWS
    assert load_rows(iter(ROWS)) == ROWS  # any iterable of rows


def test_a_dataframe_gives_its_records_as_plain_python_values():
    rows = load_rows(pd.DataFrame(ROWS))
    assert rows == ROWS
    assert type(rows[0]["difficulty"]) is int  # not numpy.int64: json/pickle/agents see plain data


def test_a_hugging_face_dataset_gives_its_rows():
    import datasets  # the `datasets` extra (in the test extra too)

    assert load_rows(datasets.Dataset.from_list(ROWS)) == ROWS
    with pytest.raises(DatasetError, match=r"DatasetDict with splits \['train'\].*ds\['train'\]"):
        load_rows(datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_files_of_every_format_read_back_the_rows(tmp_path, suffix):
    path = tmp_path / f"rows{suffix}"
    frame = pd.DataFrame(ROWS)
    if suffix == ".jsonl":
        write_jsonl(ROWS, path)
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    rows = load_rows(str(path))
    if suffix == ".csv":  # CSV has no types: pandas reads "5" back as the number 5
        assert rows == [{**r, "target": int(r["target"])} for r in ROWS]
    else:
        assert rows == ROWS
    assert load_rows(path) == rows  # a Path works as well as a str


def test_jsonl_keeps_nested_rows_exactly(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi ✓"}], "meta": {"tags": ["a", "b"], "score": None}}]
    assert read_row_file(write_jsonl(rows, tmp_path / "nested.jsonl")) == rows


def test_unreadable_sources_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_rows(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: not valid JSON"):
        load_rows(bad)
    (tmp_path / "obj.json").write_text('{"a": 1}')
    with pytest.raises(DatasetError, match="must hold a list of rows"):
        load_rows(tmp_path / "obj.json")
    with pytest.raises(DatasetError, match="single mapping"):
        load_rows({"prompt": "x"})
    with pytest.raises(DatasetError, match="got int"):
        load_rows(3)
    with pytest.raises(
        DatasetError, match=r"a pandas Series; pass a DataFrame, e.g. series.to_frame\('prompt'\)"
    ):
        load_rows(pd.DataFrame(ROWS)["prompt"])
    with pytest.raises(DatasetError, match="row 1 cannot be written as JSON"):
        write_jsonl([{"a": 1}, {"a": object()}], tmp_path / "x.jsonl")


def test_check_rows_rejects_empty_datasets_and_rows_that_are_not_mappings():
    check_rows(ROWS)  # fine
    with pytest.raises(DatasetError, match="data.source is empty"):
        check_rows([], name="data.source")
    with pytest.raises(DatasetError, match="row 2 is a str, not a mapping"):
        check_rows([{"a": 1}, {"a": 2}, "oops"])


def test_check_rows_for_subproc_agents_rejects_rows_pickle_cannot_send():
    rows = [{"a": 1}, {"a": lambda: 1}]
    check_rows(rows)  # inline agents get the row object itself
    with pytest.raises(DatasetError, match=r"row 1 cannot be pickled .*mode 'subproc'"):
        check_rows(rows, picklable=True)


def test_split_rows_is_seeded_disjoint_and_holds_out_the_fraction():
    rows = [{"i": i} for i in range(20)]
    train, held_out = split_rows(rows, 0.25, seed=0)
    assert len(held_out) == 5 and len(train) == 15
    assert sorted(r["i"] for r in train + held_out) == list(range(20))
    assert split_rows(rows, 0.25, seed=0) == (train, held_out)
    assert split_rows(rows, 0.25, seed=1) != (train, held_out)
    assert len(split_rows(rows[:3], 0.01, seed=0)[1]) == 1  # at least one held out
    with pytest.raises(DatasetError, match="cannot be split"):
        split_rows(rows[:1], 0.5, seed=0)


def make_rows():
    return [dict(r) for r in ROWS]


NOT_A_FUNCTION = 3


def test_a_module_function_name_gives_the_rows_it_returns():
    assert load_rows("tests.data.test_rows:make_rows") == ROWS
    from areal_nb.data.tool_task import test_rows

    assert load_rows("areal_nb.data.tool_task:test_rows") == test_rows()
    with pytest.raises(
        DatasetError, match=r"'tests.data.test_rows:missing': cannot import it \(AttributeError"
    ):
        load_rows("tests.data.test_rows:missing")
    with pytest.raises(DatasetError, match="cannot import it .ModuleNotFoundError"):
        load_rows("no_such_module:rows")
    with pytest.raises(DatasetError, match="is a int, not a function that returns rows"):
        load_rows("tests.data.test_rows:NOT_A_FUNCTION")


# ----------------------------------------------------------------------------- tables give plain values


def test_a_dataframe_of_rows_with_different_keys_gives_none_for_the_gaps():
    rows = [
        {"prompt": "What is 2 + 3?", "target": "5"},
        {"messages": [{"role": "user", "content": "What is 7 - 4?"}], "target": "3"},
    ]
    assert pd.DataFrame(rows)["messages"].isna()[0]  # pandas fills the gap with NaN ...
    assert load_rows(pd.DataFrame(rows)) == [
        {"prompt": "What is 2 + 3?", "target": "5", "messages": None},
        {"prompt": None, "target": "3", "messages": rows[1]["messages"]},
    ]


def test_empty_csv_and_tsv_cells_are_none_and_a_tsv_is_read_by_tabs(tmp_path):
    (tmp_path / "rows.csv").write_text("prompt,target,note\nWhat is 2 + 3?,5,\nWhat is 7 - 4?,3,easy\n")
    (tmp_path / "rows.tsv").write_text("prompt\ttarget\tnote\nWhat is 2 + 3?\t5\t\nWhat is 7 - 4?\t3\teasy\n")
    expected = [
        {"prompt": "What is 2 + 3?", "target": 5, "note": None},
        {"prompt": "What is 7 - 4?", "target": 3, "note": "easy"},
    ]
    for name in ("rows.csv", "rows.tsv"):
        rows = load_rows(tmp_path / name)
        assert rows == expected and type(rows[0]["target"]) is int


def test_parquet_list_and_struct_columns_come_back_as_lists_and_dicts(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}], "tags": ["a", "b"], "score": 0.5, "ok": True},
        {"messages": [{"role": "user", "content": "yo"}], "tags": [], "score": None, "ok": False},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    loaded = load_rows(tmp_path / "rows.parquet")
    assert loaded == rows  # not numpy arrays: the rows pickle, print and save as JSON like the originals
    assert type(loaded[0]["tags"]) is list and type(loaded[0]["ok"]) is bool
    write_jsonl(loaded, tmp_path / "again.jsonl")  # what save() does with Python rows


def test_files_with_a_byte_order_mark_read_as_without(tmp_path):
    bom = "\ufeff"
    (tmp_path / "rows.jsonl").write_text(bom + "".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    (tmp_path / "rows.json").write_text(bom + json.dumps(ROWS), encoding="utf-8")
    (tmp_path / "rows.csv").write_text(bom + pd.DataFrame(ROWS).to_csv(index=False), encoding="utf-8")
    assert load_rows(tmp_path / "rows.jsonl") == ROWS and load_rows(tmp_path / "rows.json") == ROWS
    assert list(load_rows(tmp_path / "rows.csv")[0]) == ["prompt", "target", "difficulty"]


def test_a_jsonl_line_that_is_not_an_object_is_named_by_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n\n["prompt", "b"]\n')
    with pytest.raises(DatasetError, match=r"rows.jsonl:3: a row must be a JSON object, got list"):
        load_rows(path)

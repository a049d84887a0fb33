"""Loading real GSM8K from local JSONL files."""

from __future__ import annotations

import json

import pytest

from areal_nb.data import load_gsm8k

ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {"question": "How much is a thousand and one?", "answer": "1000+1=1001\n#### 1,001"},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")


def test_load_local_jsonl_file(tmp_path):
    _write(tmp_path / "gsm8k.jsonl", ROWS)
    problems = load_gsm8k(str(tmp_path / "gsm8k.jsonl"))
    assert [p["answer_value"] for p in problems] == ["72", "1001"]
    assert problems[0]["question"] == ROWS[0]["question"]
    assert problems[0]["answer"] == ROWS[0]["answer"]
    assert problems[0]["messages"] == [{"role": "user", "content": ROWS[0]["question"]}]


def test_load_split_from_a_folder(tmp_path):
    _write(tmp_path / "test.jsonl", ROWS[1:])
    assert [p["answer_value"] for p in load_gsm8k(str(tmp_path), split="test")] == ["1001"]
    with pytest.raises(FileNotFoundError, match="no train.jsonl"):
        load_gsm8k(str(tmp_path), split="train")


def test_bad_files_give_the_line_number(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_gsm8k(str(bad))
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected an object"):
        load_gsm8k(str(bad))
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: answer has no '####'"):
        load_gsm8k(str(bad))


def test_unknown_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a local JSONL file"):
        load_gsm8k(str(tmp_path / "missing.jsonl"))


def test_hub_without_datasets_or_network_is_a_clear_error():
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the `datasets` package"):
            load_gsm8k("openai/gsm8k")
    else:  # installed but offline in tests (HF_HUB_OFFLINE=1)
        with pytest.raises(RuntimeError, match="could not load openai/gsm8k"):
            load_gsm8k("openai/gsm8k")


def test_splits_of_a_source_never_overlap(tmp_path):
    from areal_nb.data import generate_problems, load_gsm8k_split, split_of

    # generated problems already respect split_of: 180 training questions, then 20 held-out ones
    problems = generate_problems(180, seed=3) + generate_problems(20, split="test")
    rows = [{"question": p["question"], "answer": p["answer"]} for p in problems]
    # a folder: its train.jsonl and test.jsonl
    (tmp_path / "dir").mkdir()
    _write(tmp_path / "dir" / "train.jsonl", rows[:150])
    _write(tmp_path / "dir" / "test.jsonl", rows[150:])
    assert [p["question"] for p in load_gsm8k_split(str(tmp_path / "dir"), "test")] == [
        r["question"] for r in rows[150:]
    ]
    # a *train* file next to its *test* sibling: the file trains, the sibling tests
    _write(tmp_path / "gsm8k_train.jsonl", rows[:150])
    _write(tmp_path / "gsm8k_test.jsonl", rows[150:160])
    assert len(load_gsm8k_split(str(tmp_path / "gsm8k_train.jsonl"), "train")) == 150
    assert len(load_gsm8k_split(str(tmp_path / "gsm8k_train.jsonl"), "test")) == 10
    # any other single file: split by question, so no held-out question is ever trained on
    _write(tmp_path / "all.jsonl", rows)
    train = load_gsm8k_split(str(tmp_path / "all.jsonl"), "train")
    test = load_gsm8k_split(str(tmp_path / "all.jsonl"), "test")
    assert [p["question"] for p in test] == [r["question"] for r in rows[180:]]
    assert all(split_of(p["question"]) == "train" for p in train)
    assert (
        len(train) + len(test) == 200
        and test
        and not {p["question"] for p in train} & {p["question"] for p in test}
    )
    with pytest.raises(ValueError, match="split"):
        load_gsm8k_split(str(tmp_path / "all.jsonl"), "validation")

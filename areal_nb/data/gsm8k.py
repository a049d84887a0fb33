"""Real GSM8K: from a local JSONL file (or a folder of `<split>.jsonl`), or from the hub."""

from __future__ import annotations

from pathlib import Path

from areal_nb.errors import DatasetError, DatasetUnavailableError, InvalidArgumentError

from .problems import make_problem, split_of
from .rows import jsonl_objects

_HUB_NAMES = ("openai/gsm8k", "gsm8k")


def load_gsm8k(path_or_name: str, split: str = "train") -> list[dict]:
    """GSM8K problems in the same dict shape as `generate_problems`.

    `path_or_name` is a JSONL file with "question" and "answer" fields per line, a folder
    holding `<split>.jsonl`, or the hub dataset "openai/gsm8k" (needs `datasets` and network).
    """
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        path = path / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"no {split}.jsonl in GSM8K folder {path_or_name!r}")
    if path.is_file():
        return _load_jsonl(path)
    if path_or_name in _HUB_NAMES:
        return _load_from_hub(split)
    raise FileNotFoundError(
        f"{path_or_name!r} is neither a local JSONL file, a folder with {split}.jsonl, "
        f"nor one of the hub names {_HUB_NAMES}"
    )


def load_gsm8k_split(source: str, split: str) -> list[dict]:
    """The `split` ("train" or "test") of a GSM8K source, never overlapping the other.

    A folder (`train.jsonl`/`test.jsonl`) or the hub name: that split. A file whose name holds
    "train" next to the same name with "test" (`gsm8k_train.jsonl`, `gsm8k_test.jsonl`): the file
    for training, its sibling for testing. Any other single file is split by question
    (`split_of`, 10 % test), so evaluation never scores a question the policy trained on.
    """
    if split not in ("train", "test"):
        raise InvalidArgumentError(f"split must be 'train' or 'test', got {split!r}")
    path = Path(source).expanduser()
    if not path.is_file():
        return load_gsm8k(source, split)
    sibling = path.with_name(path.name.replace("train", "test"))
    if "train" in path.name and sibling.is_file():
        return _load_jsonl(path if split == "train" else sibling)
    return [p for p in _load_jsonl(path) if split_of(p["question"]) == split]


def _load_jsonl(path: Path) -> list[dict]:
    problems = []
    for lineno, row in jsonl_objects(path):
        if "question" not in row or "answer" not in row:
            raise DatasetError(f"{path}:{lineno}: expected an object with 'question' and 'answer'")
        try:
            problems.append(make_problem(str(row["question"]), str(row["answer"])))
        except ValueError as e:
            raise DatasetError(f"{path}:{lineno}: {e}") from e
    return problems


def _load_from_hub(split: str) -> list[dict]:
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            "loading GSM8K from the hub needs the `datasets` package (pip install datasets); "
            "or pass a local JSONL file"
        ) from e
    try:
        rows = datasets.load_dataset("openai/gsm8k", "main", split=split)
    except Exception as e:
        raise DatasetUnavailableError(
            f"could not load openai/gsm8k split {split!r} from the hub (offline?): {e}; "
            "pass a local JSONL file instead"
        ) from e
    return [make_problem(r["question"], r["answer"]) for r in rows]

"""Task data: generated GSM8K-format arithmetic problems, real GSM8K, math-verify scoring, and a
user's own rows in any common form (`rows.py`)."""

from .gsm8k import load_gsm8k, load_gsm8k_split
from .problems import (
    CORRECTION_PROMPT,
    TaskConfig,
    generate_problems,
    make_problem,
    reference_reply,
    reply_for,
    split_of,
)
from .rows import (
    DatasetError,
    check_rows,
    is_row_factory,
    is_row_file,
    load_rows,
    read_row_file,
    split_rows,
    write_jsonl,
)
from .scoring import score_answer

__all__ = [
    "CORRECTION_PROMPT",
    "DatasetError",
    "TaskConfig",
    "check_rows",
    "generate_problems",
    "is_row_factory",
    "is_row_file",
    "load_gsm8k",
    "load_gsm8k_split",
    "load_rows",
    "make_problem",
    "read_row_file",
    "reference_reply",
    "reply_for",
    "score_answer",
    "split_of",
    "split_rows",
    "write_jsonl",
]

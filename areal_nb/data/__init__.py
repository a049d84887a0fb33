"""Task data: generated GSM8K-format arithmetic problems, real GSM8K, math-verify scoring."""

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
from .scoring import score_answer

__all__ = [
    "CORRECTION_PROMPT",
    "TaskConfig",
    "generate_problems",
    "load_gsm8k",
    "load_gsm8k_split",
    "make_problem",
    "reference_reply",
    "reply_for",
    "score_answer",
    "split_of",
]
